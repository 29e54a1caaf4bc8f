"""The OIP v2 gRPC messages (``inference.*``), built from the committed descriptor in a private pool.

``open_inference_grpc.proto`` is the source; ``_descriptor.py`` is its compiled form (regenerate with
``python -m veil.engine.proto.generate``). A private :class:`~google.protobuf.descriptor_pool.DescriptorPool`
keeps these ``inference.*`` names from clashing with ``tritonclient.grpc``'s or ``kserve``'s copies of the same
package in the default pool; on the wire only field numbers and the service path
``/inference.GRPCInferenceService/<Method>`` matter, so stock clients interoperate.

Example:
    >>> from veil.engine import proto
    >>> proto.msg.ModelInferRequest(model_name="digits").SerializeToString()
    b'\\n\\x06digits'
"""

from __future__ import annotations

from types import SimpleNamespace

from google.protobuf import descriptor_pool, message_factory

from ._descriptor import SERIALIZED

SERVICE = "inference.GRPCInferenceService"

_POOL = descriptor_pool.DescriptorPool()
FILE = _POOL.AddSerializedFile(SERIALIZED)
# every top-level message class by name (nested ones are attributes: ModelInferRequest.InferInputTensor)
msg = SimpleNamespace(**{name: message_factory.GetMessageClass(d) for name, d in FILE.message_types_by_name.items()})
# method name -> (request class, response class), in the service's order
METHODS = {m.name: (message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type))
           for m in FILE.services_by_name["GRPCInferenceService"].methods}
