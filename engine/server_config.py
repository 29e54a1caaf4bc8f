"""``veil serve``'s settings (``ServerConfig``), without fastapi or onnxruntime: the command's parser is built from
them, so ``veil serve --help`` answers at once (issue 24). The server itself is ``server.py``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from veil.config import Config, ConfigError, field

if TYPE_CHECKING:
    from .runtime import RuntimeOptions


@dataclass
class ServerConfig(Config):
    """Serve a model repository over the Open Inference Protocol v2.

    Args:
        repo (str): the model repository folder (Triton layout).
        host (str): address to bind; keep 127.0.0.1 unless a proxy or firewall fronts the server.
        trusted_proxy (str): comma-separated addresses whose X-Forwarded-For / X-Forwarded-Proto are believed
            (empty: none; the peer's own address is the client's, which bounds HE keys per source).
        port (int): TCP port.
        grpc_port (int | None): also serve OIP v2 gRPC on this port (0: a free one; None: off).
        grpc_max_message_mb (float): largest gRPC message received or sent.
        admin_token (str | None): enables the repository API (load/unload/index) behind this bearer token.
        max_body_mb (float): largest request body accepted (413 beyond it), also once decompressed.
        max_json_elements (int): most tensor elements a request may send as JSON data (413 beyond it).
        max_json_mb (float): largest JSON part of an inference request (413 beyond it).
        max_bytes_elements (int): most elements one BYTES input may declare, HTTP binary or gRPC (413 beyond it).
        body_timeout_s (float): how long a client may take to send a request body (408 beyond it).
        log_level (str): uvicorn and veil log level.
        device (str): default execution provider for models whose instance_group kind is KIND_AUTO.
        intra_op_threads (int): ORT intra-op threads per session; 0 = physical cores.
        graph_optimization (str): ORT graph optimization level when config.pbtxt sets none.
        graceful_timeout_s (float): how long shutdown waits for in-flight requests.
    """

    repo: str = field("", "model repository folder (Triton layout: <model>/config.pbtxt, <model>/<version>/model.onnx)")
    host: str = field("127.0.0.1", "address to bind (keep 127.0.0.1 unless a proxy fronts the server)")
    port: int = field(8000, "TCP port")
    trusted_proxy: str = field("", "comma-separated proxy addresses (or CIDRs) whose X-Forwarded-For header names the "
                                   "client; empty: the header is ignored from everyone, 127.0.0.1 included")
    grpc_port: int | None = field(None, "also serve the OIP v2 gRPC API (inference.GRPCInferenceService) on this port "
                                        "(0: a free one; with --ray: on the front replica); off when unset")
    grpc_max_message_mb: float = field(64.0, "largest gRPC message in MiB, received or sent (RESOURCE_EXHAUSTED "
                                             "beyond)")
    admin_token: str | None = field(None, "enable the repository API behind 'Authorization: Bearer TOKEN' "
                                          "(or set VEIL_ADMIN_TOKEN); off when unset")
    max_body_mb: float = field(64.0, "largest request body in MiB; larger bodies get 413")
    max_json_elements: int = field(4_194_304, "most tensor elements one inference request may send as JSON data "
                                              "(all inputs together; 413 beyond; binary tensors are not counted)")
    max_json_mb: float = field(16.0, "largest JSON part of an inference request in MiB (413 beyond; parsing it "
                                     "holds the GIL, so this bounds how long one request can stall the others)")
    max_bytes_elements: int = field(1_048_576, "most elements one BYTES input may declare (binary HTTP or gRPC; "
                                               "413 / RESOURCE_EXHAUSTED beyond, refused before any is decoded)")
    body_timeout_s: float = field(60.0, "seconds a client may take to send a request body (408 beyond)")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = field("info", "log level")
    device: Literal["auto", "cpu", "cuda"] = field(
        "auto", "execution provider for models whose instance_group kind is KIND_AUTO (auto: CUDA when available)")
    intra_op_threads: int = field(0, "ONNX Runtime intra-op threads per session (0: physical cores; "
                                     "config.pbtxt intra_op_thread_count overrides)")
    graph_optimization: Literal["disable", "basic", "extended", "all"] = field(
        "all", "ONNX Runtime graph optimization level (config.pbtxt optimization.graph.level overrides)")
    graceful_timeout_s: float = field(30.0, "seconds shutdown waits for in-flight requests")
    he_key_dir: str = field("", "where registered HE evaluation keys are stored (default: <repo>/.he-keys)")
    he_key_quota_mb: float = field(2048.0, "disk quota for registered HE evaluation keys, MiB")
    he_key_ttl_s: float = field(86400.0, "seconds a registered HE key stays valid")
    he_key_cache: int = field(8, "registered HE key sets kept parsed in memory (LRU; ~290 MiB each at N=16384)")
    he_processes: int = field(1, "processes one HE request's large linear ops and ciphertexts are split over (forked "
                                 "workers sharing the encoded plan; veil.he.parallel); 0: every core, 1: serial "
                                 "(default until a speedup is measured: 0.78-0.96x on a loaded 2-core machine)")
    he_encoded_mb: float = field(4096.0, "per HE model, plaintext masks encoded once at load up to this many MiB "
                                         "(shared by a deep model's rounds in order; the rest is encoded at each "
                                         "use): server memory traded for speed")
    he_keys_per_source: int = field(4, "HE key sets one client address may hold; one more is refused (413) "
                                       "until one is deleted or expires")

    def validate(self) -> None:
        if not self.repo:
            raise ConfigError("ServerConfig.repo: expected a model repository folder (--repo DIR), received ''")
        if self.max_body_mb <= 0:
            raise ConfigError(f"ServerConfig.max_body_mb: expected > 0, received {self.max_body_mb}")
        if self.max_bytes_elements < 1:
            raise ConfigError(f"ServerConfig.max_bytes_elements: expected >= 1, received {self.max_bytes_elements}")
        if self.max_json_elements < 1 or self.max_json_mb <= 0 or self.body_timeout_s <= 0:
            raise ConfigError(f"ServerConfig: expected max_json_elements >= 1, max_json_mb > 0 and body_timeout_s > 0, "
                              f"received {self.max_json_elements}, {self.max_json_mb} and {self.body_timeout_s}")
        if self.he_encoded_mb < 0:
            raise ConfigError(f"ServerConfig.he_encoded_mb: expected >= 0, received {self.he_encoded_mb}")
        if self.he_processes < 0:
            raise ConfigError(f"ServerConfig.he_processes: expected >= 0 (0: every core), received {self.he_processes}")
        if self.he_key_cache < 0 or self.he_keys_per_source < 1:
            raise ConfigError(f"ServerConfig: expected he_key_cache >= 0 and he_keys_per_source >= 1, received "
                              f"{self.he_key_cache} and {self.he_keys_per_source}")
        if (self.grpc_port is not None and not 0 <= self.grpc_port <= 65535) or self.grpc_max_message_mb <= 0:
            raise ConfigError(f"ServerConfig: expected grpc_port in 0..65535 and grpc_max_message_mb > 0, received "
                              f"{self.grpc_port} and {self.grpc_max_message_mb}")
        for address in filter(None, (a.strip() for a in self.trusted_proxy.split(","))):
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ConfigError(f"ServerConfig.trusted_proxy: expected comma-separated IP addresses or CIDRs, "
                                  f"received {address!r}") from None
        if self.admin_token == "":
            raise ConfigError("ServerConfig.admin_token: expected a non-empty token or none, received ''")

    def runtime_options(self) -> RuntimeOptions:
        from .runtime import CPU, RuntimeOptions, providers_for  # onnxruntime: only once a server starts

        providers = {"auto": providers_for("KIND_AUTO"), "cpu": [CPU], "cuda": providers_for("KIND_GPU")}[self.device]
        return RuntimeOptions(providers=providers, intra_op_threads=self.intra_op_threads,
                              graph_level=self.graph_optimization, he_processes=self.he_processes,
                              he_encoded_bytes=int(self.he_encoded_mb * 2**20))
