"""Plans deeper than one CKKS parameter set: cut the ONNX graph into segments, refresh on the client.

SEAL has no bootstrapping, so a plan needing more levels than the largest 128-bit set (he.md §7.7) is cut
into segments that each fit. After segment k the server returns its output ciphertexts; the client
decrypts them, decodes them with segment k's output layout, re-encodes them with segment k+1's input
layout, encrypts them *fresh* (new randomness, top level of segment k+1's parameters, under that
segment's keys) and sends round k+1. The client never sends a decryption back (Li–Micciancio), only
fresh encryptions; what it learns is the activations at the cuts (docs/he.md, "Deep plans").

The graph is cut, not the plan: a cut point is an ONNX tensor that is the only ciphertext-dependent value
alive between the nodes before it and the nodes after it (for sequential and residual CNNs: between
blocks). Each segment is extracted as a standalone one-input, one-output ONNX model and compiled with
the normal :func:`veil.he.compile`, so segments use whatever layout the compiler uses.

Choice of cuts (:func:`compile_segmented`): exact dynamic programming over the candidate cuts for the lowest
:func:`veil.he.cost.objective` (predicted seconds of the segments' key switches and products, each refresh
round's client work, the keys' one-time generation and upload amortized), among the cuttings whose keys fit
``max_key_bytes`` (if none does, the one with the fewest key bytes is refused with that figure). So a refresh
round that lets the next segment run at a smaller ring (a rotation ~7x cheaper, keys ~6x smaller from
N = 32768 to 16384) is taken when it is cheaper end to end. A segment [c_i, c_j] is
feasible when it compiles within a 128-bit set; for a fixed start its levels never decrease as the end
moves later (every op adds >= 0 levels, and the output at c_j costs at most the linear op the longer
segment pays where that tensor is next used), so the scan from c_i stops at the first infeasible end.

Server side, :class:`veil.he.rounds.RoundBook` binds the rounds of one request (round index, request id, the key
ids of every round) and refuses a round replayed, out of order or for another request or key (HTTP 409).

Example:
    >>> plan = compile_segmented("cnn.onnx", precision_bits=20, refresh=True)
    >>> plan.rounds, plan.cuts, [p.levels for p in plan.plans]
    (2, ['avg_pool2d'], [15, 14])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.he.cost import MAX_KEY_BYTES, ROUND_SECONDS, key_bytes, objective, plan_cost
from veil.he.cost import MODEL as COST_MODEL
from veil.he.cuts import cut_candidates, extract_segment, with_shapes
from veil.he.errors import ParameterError
from veil.he.latency import replicated_segments
from veil.he.params import POLY_MODULUS_DEGREES
from veil.he.plan import Plan

from veil.atomic import atomic_dir, write_atomic

if TYPE_CHECKING:
    import onnx

FORMAT = "veil.he.segments/1"
# key manifests the segment search may switch a segment to when the keys exceed the budget (fewer keys, more switches)
LEANER_MANIFESTS = ("budget:32", "budget:16", "budget:8", "pow2", "binary")
JSON_NAME = "segments.json"


# -- the segmented plan ---------------------------------------------------------------------------------
@dataclasses.dataclass
class SegmentedPlan:
    """One plan per segment, the ONNX tensors cut between them and the compiler's report.

    Args:
        plans: the segments' plans in evaluation order; segment k's output is segment k+1's input.
        cuts: the ONNX tensor names between segments (``len(plans) - 1`` of them).
        report: what was chosen and why (rounds, cuts, per-segment levels and N, candidates, cost).
    """

    plans: list[Plan]
    cuts: list[str]
    report: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.plans or len(self.cuts) != len(self.plans) - 1:
            raise ValueError(f"SegmentedPlan: expected len(cuts) = len(plans) - 1 >= 0, received "
                             f"{len(self.plans)} plans and cuts {self.cuts}")
        for k, (a, b) in enumerate(zip(self.plans, self.plans[1:], strict=False)):
            out, inp = a.spec["outputs"][0], b.spec["inputs"][0]
            if out["name"] != self.cuts[k] or inp["name"] != self.cuts[k] or list(out["shape"]) != list(inp["shape"]):
                raise ValueError(f"SegmentedPlan: segment {k} output {out['name']} {out['shape']} must be segment "
                                 f"{k + 1}'s input {inp['name']} {inp['shape']} (cut {self.cuts[k]!r})")

    @property
    def rounds(self) -> int:
        """Client round trips per inference (1: no refresh)."""
        return len(self.plans)

    def hash(self) -> str:
        """The plan hash of a one-segment plan; else SHA-256 over the cuts and every segment's plan hash."""
        if self.rounds == 1:
            return self.plans[0].hash()
        text = json.dumps({"format": FORMAT, "cuts": self.cuts, "segments": [p.hash() for p in self.plans]},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def segments(self) -> list[dict[str, Any]]:
        """Per segment: what a client needs (parameters, hashes, key manifest, levels, input and output)."""
        out = []
        for k, plan in enumerate(self.plans):
            params = plan.parameters()
            out.append({"index": k, "input": plan.spec["inputs"][0]["name"], "output": plan.spec["outputs"][0]["name"],
                        "levels": plan.levels, "parameters": params.to_dict(), "params_hash": params.hash(),
                        "plan_hash": plan.hash(), "galois_steps": plan.galois_steps})
        return out

    def save(self, folder: str | Path) -> Path:
        """One segment: a plain plan in ``folder``. Several: ``segment_<k>/`` plans, then ``segments.json``."""
        folder = Path(folder)
        if self.rounds == 1:
            return self.plans[0].save(folder)
        for k, plan in enumerate(self.plans):
            with atomic_dir(folder / f"segment_{k}") as tmp:
                plan.save(tmp)
        spec = {"format": FORMAT, "rounds": self.rounds, "cuts": self.cuts, "plan_hash": self.hash(),
                "segments": [{"folder": f"segment_{s['index']}", **s} for s in self.segments()],
                "report": self.report}
        write_atomic(folder / JSON_NAME, json.dumps(spec, indent=1, sort_keys=True))  # last: readers see all or none
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> SegmentedPlan:
        """Read what :meth:`save` wrote (a plain plan folder is one segment); every hash is re-checked."""
        folder = Path(folder)
        if not (folder / JSON_NAME).is_file():
            return cls([Plan.load(folder)], [])
        spec = json.loads((folder / JSON_NAME).read_text())
        if spec.get("format") != FORMAT:
            raise ValueError(f"{folder / JSON_NAME}: expected format {FORMAT!r}, received {spec.get('format')!r}")
        plans = []
        for k, seg in enumerate(spec["segments"]):
            if seg.get("folder") != f"segment_{k}":
                raise ValueError(f"{folder / JSON_NAME}: segments[{k}].folder expected 'segment_{k}', "
                                 f"received {seg.get('folder')!r}")
            plan = Plan.load(folder / seg["folder"])
            if plan.hash() != seg["plan_hash"]:
                raise ValueError(f"{folder / seg['folder']}: plan_hash expected {seg['plan_hash']} "
                                 f"(segments.json), received {plan.hash()}")
            plans.append(plan)
        loaded = cls(plans, list(spec["cuts"]), spec.get("report", {}))
        if loaded.hash() != spec.get("plan_hash"):
            raise ValueError(f"{folder / JSON_NAME}: plan_hash expected {loaded.hash()} (recomputed), "
                             f"received {spec.get('plan_hash')}")
        return loaded


# -- the compiler driver ---------------------------------------------------------------------------------------
def _too_deep_levels(exc: ParameterError) -> int | None:
    found = re.search(r"needs (\d+) levels", str(exc))
    return int(found.group(1)) if found else None


def compile_segmented(onnx_model: onnx.ModelProto | str | Path, mode: str = "latency", precision_bits: int = 20,
                      refresh: bool = False, max_poly_modulus_degree: int | None = None,
                      compiler: Callable[..., Plan] | None = None, max_key_bytes: int = MAX_KEY_BYTES,
                      replicate: bool | None = None) -> SegmentedPlan:
    """Compile ``onnx_model`` into one plan, or (``refresh=True``) into the fewest, cheapest segments.

    Args:
        onnx_model: the exported model (or its path): one input (B, ...), one output.
        mode / precision_bits: passed to :func:`veil.he.compile` for every segment.
        refresh: allow client-refresh rounds when no 128-bit set holds the whole plan (off: refused as before).
        max_poly_modulus_degree: with ``refresh``, also cut where a segment would need a larger ring than
            this (a client or server that cannot hold N = 32768 keys); None: any 128-bit set.
        compiler: the compile function (default :func:`veil.he.compile`); tests pass a wrapper.
        max_key_bytes: the most evaluation-key bytes the plan (with ``refresh``: all its segments) may need; a
            plan over it is switched to a leaner key manifest, cut (with ``refresh``), or refused.
        replicate: latency plans: True compiles every segment replicated (``veil.he.compile(replicate=True)``: one
            image per ciphertext, its block tiled over every slot by the client); False none; None (default) each
            segment whose block leaves slots free, when the plan holds one image per ciphertext anyway (its
            smallest batch capacity is 1): the same one image at fewer diagonals (merged modulo the block) and no
            broadcast window, while a plan that batches images stays batched (:func:`replicated_segments`).

    Returns:
        A :class:`SegmentedPlan`; ``report`` says what was chosen and why.

    Raises:
        CompileError: an op the compiler cannot lower.
        ParameterError: too deep for one set and ``refresh`` is off (the message names nodes and levels,
            and the flag), or a stretch between two adjacent cut points is too deep by itself.
    """
    import onnx
    from veil.he.compiler import compile as he_compile

    if replicate and mode != "latency":
        raise ParameterError(f"compile_segmented: `replicate` expected only with mode 'latency', received mode "
                             f"{mode!r}")
    if max_poly_modulus_degree is not None and not refresh:
        raise ParameterError(f"compile_segmented: `max_poly_modulus_degree` expected only with refresh=True, "
                             f"received {max_poly_modulus_degree} with refresh=False")
    compiler = compiler or he_compile
    model = onnx_model if isinstance(onnx_model, onnx.ModelProto) else onnx.load(str(onnx_model))
    cap = max_poly_modulus_degree or POLY_MODULUS_DEGREES[-1]
    try:
        whole = compiler(model, mode=mode, precision_bits=precision_bits)
    except ParameterError as exc:
        if not refresh:
            raise ParameterError(f"{exc} Or export with client refresh (`veil export he --refresh`, "
                                 f"compile_segmented(..., refresh=True)) to run it in several rounds.") from exc
        needed, whole_error = _too_deep_levels(exc), str(exc)
    else:
        needed = whole.levels
        if whole.parameters().poly_modulus_degree <= cap:
            single = _within_key_budget(whole, max_key_bytes, refuse=not refresh)
            if single is not None:
                return _replicate_single(single, model, mode, precision_bits, compiler, max_key_bytes, replicate)
            whole_error = (f"one set's keys need more than max_key_bytes={max_key_bytes} under every key manifest "
                           f"({', '.join(('as compiled', *LEANER_MANIFESTS))})")
        else:
            whole_error = f"it needs N={whole.parameters().poly_modulus_degree} > max_poly_modulus_degree={cap}"
    candidates = cut_candidates(model)
    model = with_shapes(model, candidates)
    points = [model.graph.input[0].name, *candidates, model.graph.output[0].name]
    plans, ends, fewest = _search(model, points, mode, precision_bits, compiler, cap, max_key_bytes, replicate)
    cuts = [points[j] for j in ends[:-1]]
    report = _report(plans, cuts, candidates, needed, whole_error, fewest, cap, max_key_bytes)
    return SegmentedPlan(plans, cuts, report)


def _replicate_single(single: SegmentedPlan, model: onnx.ModelProto, mode: str, precision_bits: int,
                      compiler: Callable[..., Plan], max_key_bytes: int, replicate: bool | None) -> SegmentedPlan:
    """The one-round plan compiled replicated where :func:`replicated_segments` says so (same key manifest),
    kept when its keys still fit ``max_key_bytes``."""
    from veil.he.compiler import with_key_manifest

    plan = single.plans[0]
    if plan.replicated or not replicated_segments([plan], replicate)[0]:
        return single
    tiled = with_key_manifest(compiler(model, mode=mode, precision_bits=precision_bits, replicate=True),
                              plan.spec["rotation_keys"])
    if key_bytes([tiled]) > max_key_bytes and not replicate:
        return single
    return SegmentedPlan([tiled], [], {**single.report, "key_bytes": key_bytes([tiled]), "replicated": [True]})


def _report(plans: list[Plan], cuts: list[str], candidates: list[str], needed: int | None, whole_error: str,
            fewest: int, cap: int, max_key_bytes: int) -> dict[str, Any]:
    """What a cutting costs segment by segment, and why it was chosen (SegmentedPlan.report)."""
    costs = [plan_cost(p) for p in plans]
    segments = [{"index": k, "input": p.spec["inputs"][0]["name"], "output": p.spec["outputs"][0]["name"],
                 "levels": p.levels, "poly_modulus_degree": p.parameters().poly_modulus_degree,
                 "coeff_mod_bit_sizes": list(p.parameters().coeff_mod_bit_sizes), "cost": c}
                for k, (p, c) in enumerate(zip(plans, costs, strict=True))]
    return {
        "rounds": len(plans), "cuts": cuts, "segments": segments, "candidates": candidates,
        "unsegmented_levels": needed, "segment_levels_total": sum(p.levels for p in plans),
        "objective_seconds": objective(costs), "predicted_seconds": sum(c["predicted_seconds"] for c in costs),
        "key_bytes": key_bytes(plans), "max_key_bytes": max_key_bytes, "cost_model": COST_MODEL,
        "fewest_rounds": fewest, "max_poly_modulus_degree": cap, "replicated": [p.replicated for p in plans],
        "why": (f"the whole plan needs {needed} levels, more than one 128-bit set within N <= {cap} offers "
                f"({whole_error}); among the cuttings at the {len(candidates)} candidate cuts whose keys fit "
                f"{max_key_bytes / 2**20:.0f} MiB, {cuts} ({len(plans)} rounds; {fewest} is the fewest possible) "
                f"has the lowest predicted cost, {objective(costs):.2f} s a request"),
    }


def _within_key_budget(whole: Plan, max_key_bytes: int, refuse: bool) -> SegmentedPlan | None:
    """The one-round plan as compiled when its keys fit ``max_key_bytes``, else under the cheapest leaner key
    manifest that fits; None when none fits and a cutting may still (``refuse`` off), else a ParameterError."""
    from veil.he.compiler import with_key_manifest

    variants = {tuple(whole.galois_steps): whole}
    if key_bytes([whole]) > max_key_bytes:  # within the budget the manifest asked for stands
        for manifest in LEANER_MANIFESTS:
            variant = with_key_manifest(whole, manifest)
            variants.setdefault(tuple(variant.galois_steps), variant)
    fitting = [(objective([plan_cost(v)]), v) for v in variants.values() if key_bytes([v]) <= max_key_bytes]
    if fitting:
        plan = min(fitting, key=lambda pair: pair[0])[1]
        manifest = "as compiled" if plan is whole else f"key manifest {plan.spec['rotation_keys']!r}"
        return SegmentedPlan([plan], [], {
            "rounds": 1, "cuts": [], "levels": plan.levels, "key_bytes": key_bytes([plan]),
            "max_key_bytes": max_key_bytes,
            "why": f"the whole plan fits one 128-bit parameter set: no refresh; {manifest}, keys within "
                   f"{max_key_bytes / 2**20:.0f} MiB"})
    if not refuse:
        return None
    need = min(key_bytes([v]) for v in variants.values())
    raise ParameterError(f"compile_segmented: max_key_bytes expected >= {need} (the fewest key bytes the plan needs "
                         f"under any key manifest, {need / 2**20:.1f} MiB), received {max_key_bytes}; raise it "
                         f"(`veil export he --max-key-mib`) or export with client refresh (`--refresh`)")


def _search(model: onnx.ModelProto, points: list[str], mode: str, precision_bits: int,
            compiler: Callable[..., Plan], cap: int, max_key_bytes: int,
            replicate: bool | None = None) -> tuple[list[Plan], list[int], int]:
    """Exact DP over cut points for the lowest :func:`veil.he.cost.objective` among cuttings within
    ``max_key_bytes`` (costed unreplicated: an upper bound on a replicated segment's cost); returns the plans, each
    replicated where :func:`replicated_segments` says so, their end points and the fewest rounds any cutting needs."""
    from veil.he.compiler import with_key_manifest

    options = _segment_options(model, points, mode, precision_bits, compiler, cap)
    ends, plans, fewest = _cheapest_cutting(options, len(points) - 1, max_key_bytes)
    starts = [0, *ends[:-1]]

    def chosen(tiled: list[bool]) -> list[Plan]:
        return [with_key_manifest(compiler(extract_segment(model, points[i], points[j]), mode=mode,
                                           precision_bits=precision_bits, **({"replicate": True} if t else {})),
                                  skeleton.spec["rotation_keys"])
                for i, j, skeleton, t in zip(starts, ends, plans, tiled, strict=True)]

    tiled = replicated_segments(plans, replicate)
    compiled = chosen(tiled)
    if any(tiled) and replicate is None and key_bytes(compiled) > max_key_bytes:
        tiled = [False] * len(plans)  # the replicated steps did not fit the budget the search met: as searched
        compiled = chosen(tiled)
    for plan, skeleton, t in zip(compiled, plans, tiled, strict=True):
        if plan.levels != skeleton.levels or (not t and plan.galois_steps != skeleton.galois_steps):
            raise RuntimeError(f"compile_segmented: a segment compiled twice differs ({plan.galois_steps[:8]}... vs "
                               f"{skeleton.galois_steps[:8]}...): the compiler must be deterministic")
    return compiled, ends, fewest


Options = dict[tuple[int, int], list[tuple[Plan, dict[str, Any]]]]


def _segment_options(model: onnx.ModelProto, points: list[str], mode: str, precision_bits: int,
                     compiler: Callable[..., Plan], cap: int) -> Options:
    """Every feasible segment [i, j] reachable from the input, compiled once, kept as its costs under each key
    manifest the search may take to meet the key budget, beside a spec-only skeleton (no tensors: every segment's
    masks at N = 32768 would be ~1 GB each); the chosen ones are compiled again at the end (deterministic)."""
    from veil.he.compiler import with_key_manifest

    n = len(points) - 1
    options: Options = {}
    errors: dict[int, str] = {}
    reachable = {0}
    for i in range(n):
        if i not in reachable:
            continue
        for j in range(i + 1, n + 1):
            try:
                plan = compiler(extract_segment(model, points[i], points[j]), mode=mode, precision_bits=precision_bits)
            except ParameterError as exc:
                errors.setdefault(i, f"from {points[i]!r} to {points[j]!r}: {exc}")
                break  # levels never decrease as the end moves later (module docstring)
            if plan.parameters().poly_modulus_degree > cap:
                errors.setdefault(i, f"from {points[i]!r} to {points[j]!r}: {plan.levels} levels need "
                                     f"N={plan.parameters().poly_modulus_degree} > {cap}")
                break
            variants = {tuple(plan.galois_steps): plan}
            for manifest in LEANER_MANIFESTS:
                variant = with_key_manifest(plan, manifest)
                variants.setdefault(tuple(variant.galois_steps), variant)
            options[i, j] = [(Plan(v.spec, {}), plan_cost(v)) for v in variants.values()]
            reachable.add(j)
    if n not in reachable:
        stuck = max(reachable)
        raise ParameterError(f"compile_segmented: no segmentation fits 128-bit parameter sets (N <= {cap}); the stretch "
                             f"{errors.get(stuck, '')} is too deep by itself even with a cut at every candidate "
                             f"({points[1:-1]}). Lower precision_bits or the depth between cut points.")
    return options


def _cheapest_cutting(options: Options, n: int, max_key_bytes: int) -> tuple[list[int], list[Plan], int]:
    """The end points and skeleton plans of the cheapest cutting of points 0..n whose keys fit ``max_key_bytes``
    (a Lagrangian price on key bytes, bisected, when the cheapest one does not), and the fewest rounds possible."""
    def cheapest(weight: Callable[[dict[str, Any]], float]) -> tuple[list[int], list[Plan]]:
        best: dict[int, tuple[float, list[int], list[Plan]]] = {0: (0.0, [], [])}
        for (i, j), choices in sorted(options.items()):
            if i not in best:
                continue
            plan, cost = min(choices, key=lambda pc: weight(pc[1]))
            entry = (best[i][0] + weight(cost), [*best[i][1], j], [*best[i][2], plan])
            if j not in best or entry[0] < best[j][0]:
                best[j] = entry
        return best[n][1], best[n][2]

    def priced(price: float) -> tuple[list[int], list[Plan]]:  # objective(), summed per segment, + key price
        return cheapest(lambda c: objective([c]) + ROUND_SECONDS + price * c["key_bytes"])

    fewest = len(cheapest(lambda c: 1.0)[0])
    ends, plans = priced(0.0)
    if key_bytes(plans) <= max_key_bytes:
        return ends, plans, fewest
    ends, plans = cheapest(lambda c: c["key_bytes"])
    need = key_bytes(plans)
    if need > max_key_bytes:
        raise ParameterError(f"compile_segmented: max_key_bytes expected >= {need} (the fewest key bytes the "
                             f"leanest cutting needs, {need / 2**20:.0f} MiB), received {max_key_bytes}; raise "
                             f"it (`veil export he --max-key-mib`) or lower precision_bits")
    low, high = 0.0, 1e-9
    while high < 1e3 and key_bytes(priced(high)[1]) > max_key_bytes:
        high *= 4
    for _ in range(40):
        price = (low + high) / 2
        found = priced(price)
        if key_bytes(found[1]) <= max_key_bytes:
            high, (ends, plans) = price, found
        else:
            low = price
    return ends, plans, fewest
