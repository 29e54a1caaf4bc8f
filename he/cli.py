"""`veil he keygen | encrypt | infer | decrypt`: encrypted inference against a running `veil serve`.

The secret key never leaves this machine; the server receives evaluation keys and ciphertexts only.

Examples:
    veil he keygen  --server http://127.0.0.1:8000 --model digits-he --keyring keys/digits.keyring
    veil he encrypt --keyring keys/digits.keyring --input x.npy --out request.bin
    veil he infer   --keyring keys/digits.keyring --request request.bin --out response.bin
    veil he decrypt --keyring keys/digits.keyring --response response.bin --out logits.npy
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

VERBS = ("keygen", "encrypt", "infer", "decrypt")
EXAMPLE = """example:
  veil he keygen  --server http://127.0.0.1:8000 --model digits-he --keyring keys/digits.keyring
  veil he encrypt --keyring keys/digits.keyring --input x.npy --out request.bin
  veil he infer   --keyring keys/digits.keyring --request request.bin --out response.bin
  veil he decrypt --keyring keys/digits.keyring --response response.bin --out logits.npy
"""


def build_parser(verb: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"veil he {verb}", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keyring", type=Path, required=True, help="secret keyring file (session details in KEYRING.json)")
    parser.add_argument("--passphrase-env", default=None, help="environment variable holding the keyring passphrase")
    if verb == "keygen":
        parser.add_argument("--server", required=True, help="base URL of veil serve, e.g. http://127.0.0.1:8000")
        parser.add_argument("--model", required=True, help="an encrypted-inference model (backend veil_he)")
    elif verb == "encrypt":
        parser.add_argument("--input", type=Path, required=True,
                            help=".npy batch of shape (B, *input shape), finite, scaled as the model's input contract "
                                 "says (digits: pixel / 16 in [0, 1]; docs/he.md 'The input x.npy'); checked before "
                                 "encrypting")
        parser.add_argument("--out", type=Path, required=True, help="request envelope to write")
    elif verb == "infer":
        parser.add_argument("--request", type=Path, required=True, help="request envelope from `veil he encrypt`")
        parser.add_argument("--out", type=Path, required=True, help="result envelope to write")
    else:
        parser.add_argument("--response", type=Path, required=True, help="result envelope from `veil he infer`")
        parser.add_argument("--out", type=Path, required=True, help=".npy file for the decrypted outputs")
    return parser


def main(argv: list[str] | None = None) -> int:
    from veil.he.client import HeSession
    from veil.he.params import CkksParameters, describe

    from veil.atomic import write_atomic

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        summary = "\n\n".join(__doc__.split("\n\n")[:2])  # the docstring's examples are EXAMPLE: print them once
        print(f"usage: veil he {{{','.join(VERBS)}}} [options]   (veil he VERB --help)\n\n{summary}\n\n{EXAMPLE}")
        return 0
    if not argv or argv[0] not in VERBS:
        print(f"veil he: expected a verb {list(VERBS)}, received {argv[:1]}\n\n{EXAMPLE}", file=sys.stderr)
        return 2
    verb, args = argv[0], build_parser(argv[0]).parse_args(argv[1:])
    passphrase = os.environ.get(args.passphrase_env) if args.passphrase_env else None
    if args.passphrase_env and not passphrase:  # never fall back to a cleartext keyring silently
        print(f"veil he {verb}: --passphrase-env expected the variable {args.passphrase_env} to hold a non-empty "
              "passphrase, received it unset or empty", file=sys.stderr)
        return 2
    if verb == "keygen":
        he = HeSession.model_he(args.server.rstrip("/"), args.model)
        segments = he.get("segments") or [he]  # a deep model: one parameter set per refresh segment
        report = [describe(CkksParameters.from_dict(s["parameters"]), s["galois_steps"]) for s in segments]
        print(json.dumps({"before_keygen": report[0] if len(report) == 1 else report, "rounds": len(segments)},
                         indent=1), file=sys.stderr)  # N, chain, levels, sizes
        session = HeSession.create(args.server, args.model, args.keyring, passphrase)
        print(json.dumps({"key_id": session.key_id, "keyring": str(args.keyring), "galois_steps": he["galois_steps"],
                          "key_ids": [key_id for key_id, _, _ in session.rings.values()], "rounds": len(segments)}))
        return 0
    session = HeSession.load(args.keyring, passphrase)
    if verb == "encrypt":
        x = np.load(args.input)
        write_atomic(args.out, session.encrypt(x))
        print(json.dumps({"request": str(args.out), "batch": len(x), "bytes": args.out.stat().st_size}))
    elif verb == "infer":
        write_atomic(args.out, session.infer(args.request.read_bytes()))  # every refresh round of a deep model
        print(json.dumps({"response": str(args.out), "bytes": args.out.stat().st_size, "rounds": session.last_rounds}))
    else:
        y = session.decrypt(args.response.read_bytes())
        np.save(args.out, y)
        print(json.dumps({"outputs": str(args.out), "shape": list(y.shape), "argmax": y.reshape(len(y), -1).argmax(1).tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
