"""Are a patched model's outputs the original's? Forwards from one state, and the verdict.

Every compared forward starts from the same state (inputs copied with their strides, buffers
restored: models that mutate them), fresh inputs keep strides, containers and valid integer
ranges, and an output with no tensor to compare is a failure, not a pass. Outputs are compared
element-wise with a per-dtype tolerance and, when that fails, both against a float64 run of the
original: a few ulps in one region grow through the layers after it, and the fair question is
whether the patched model is as close to the exact answer as the original.
"""
from __future__ import annotations

import dataclasses

# (rtol, atol) for whole-model outputs: looser than per-op verification, since differences of a
# few ulps inside the model are amplified by the layers after the patched op.
TOLERANCE = {"float32": (1e-3, 1e-4), "float64": (1e-6, 1e-8), "float16": (1e-2, 1e-3),
             "bfloat16": (2e-2, 1e-2)}


def tensors_of(out, prefix="out"):
    """Flatten a model output (tensor, tuple/list, dict, HF ModelOutput) into (name, tensor)."""
    import torch

    if isinstance(out, torch.Tensor):
        yield prefix, out
    elif isinstance(out, dict):
        for k, v in out.items():
            yield from tensors_of(v, f"{prefix}.{k}")
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            yield from tensors_of(v, f"{prefix}[{i}]")
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        for f in dataclasses.fields(out):  # a library's output class (logits=..., hidden=...)
            yield from tensors_of(getattr(out, f.name, None), f"{prefix}.{f.name}")
    # anything else (caches, None, strings) carries no comparable numbers


def _copy(t):
    """A copy of a tensor with the same sizes and strides, expanded (stride 0) ones included."""
    from kforge_tui.regions.meta import storage_span

    span = storage_span(t.shape, t.stride())
    base = t.detach().as_strided((max(1, span),), (1,)).clone()
    return base.as_strided(tuple(t.shape), tuple(t.stride()))


def map_tensors(x, fn):
    """`x` with `fn` applied to every tensor inside dicts, lists, tuples and namedtuples."""
    import torch

    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, dict):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        items = [map_tensors(v, fn) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


def fresh_copy(inputs):
    """The inputs with every tensor copied: a forward that mutates its inputs in place
    (`x.sub_(...)`) must not change what the next forward being compared sees."""
    return map_tensors(inputs, lambda t: _copy(t) if t.numel() else t.clone())


class State:
    """The model's buffers as they were before the first compared forward, put back before each
    one: a stateful model (a running mean, a step counter updated in place) must start every
    forward that is compared from the same state."""

    def __init__(self, model):
        import torch

        with torch.no_grad():
            self.saved = [(b, b.detach().clone()) for _, b in model.named_buffers()]

    def restore(self):
        import torch

        with torch.no_grad():
            for b, v in self.saved:
                if not torch.equal(b, v):
                    b.copy_(v)


def forward(model, inputs, state: State | None = None):
    import torch

    if state is not None:
        state.restore()
    inputs = fresh_copy(inputs)
    with torch.inference_mode():
        out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    return [(n, t.detach().clone()) for n, t in tensors_of(out)]


def fresh_like(inputs, seed: int):
    """Inputs of the same structure, shapes, dtypes and strides with new values: floats drawn
    with the example's mean and spread, integers from the values the example holds."""
    import torch

    from kforge_tui.regions.meta import storage_span

    g = torch.Generator().manual_seed(seed)

    def one(t):
        if t.dtype == torch.bool or t.numel() == 0:
            return _copy(t) if t.numel() else t.clone()
        # new values in the same strides (a transposed or expanded input stays one: the
        # compiled graph, and the kernels in it, were made for those strides)
        span = max(1, storage_span(t.shape, t.stride()))
        if t.is_floating_point():
            f = t.detach().float().cpu()
            std = float(f.std()) if f.numel() > 1 else 1.0
            std = std if std > 0 else 1.0
            v = torch.randn(span, generator=g) * std + float(f.mean())
        else:
            # integers are ids, classes, indices or sentinels (ignore_index=-100): new draws
            # from the values the example holds, so each stays one the model accepts
            seen = torch.unique(t.detach().cpu())
            v = seen[torch.randint(0, seen.numel(), (span,), generator=g)]
        v = v.to(t.dtype).to(t.device)
        return v.as_strided(tuple(t.shape), tuple(t.stride()))

    # tensors inside dicts, lists and tuples get new values too
    if isinstance(inputs, dict):
        return map_tensors(inputs, one)
    return tuple(map_tensors(v, one) for v in inputs)


def compare(ref: list, got: list) -> dict:
    """max abs/rel error over all outputs; within = every element within atol + rtol*|ref|."""
    import torch

    worst_abs = worst_rel = 0.0
    within, notes = True, []
    if not ref and not got:
        return {"max_abs_err": 0.0, "max_rel_err": 0.0, "within_tolerance": False,
                "notes": ["the model's outputs hold no tensor kforge can compare (tensors, "
                          "tuples, lists, dicts and dataclasses are looked into): unchecked"]}
    if [n for n, _ in ref] != [n for n, _ in got]:
        return {"max_abs_err": float("inf"), "max_rel_err": float("inf"), "within_tolerance": False,
                "notes": ["output structure differs"]}
    for (name, r), (_, g) in zip(ref, got):
        if r.shape != g.shape or r.dtype != g.dtype:
            within = False
            notes.append(f"{name}: shape/dtype {tuple(g.shape)} {g.dtype} vs {tuple(r.shape)} {r.dtype}")
            continue
        if not r.is_floating_point():
            if not torch.equal(r, g):
                within = False
                notes.append(f"{name}: integer output differs")
            continue
        rtol, atol = TOLERANCE.get(str(r.dtype).replace("torch.", ""), (1e-3, 1e-4))
        r64, g64 = r.double(), g.double()
        nan_r, nan_g = torch.isnan(r64), torch.isnan(g64)
        if not torch.equal(nan_r, nan_g):
            within = False
            notes.append(f"{name}: NaN where the original has none (or the reverse)")
        ok = ~nan_r & ~nan_g
        if not bool(ok.any()):
            continue
        diff = (r64 - g64).abs()[ok]
        ra = r64.abs()[ok]
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / (ra + atol)).max()))
        bad = int((diff > atol + rtol * ra).sum())
        if bad:
            within = False
            notes.append(f"{name}: {bad}/{diff.numel()} elements outside rtol {rtol} atol {atol}")
    return {"max_abs_err": worst_abs, "max_rel_err": worst_rel, "within_tolerance": within,
            "notes": notes}


F64_FACTOR = 2.0  # patched may be at most this many times further from float64 than eager is


def float64_judgement(model, inputs, ref, got) -> dict:
    """Max abs error of eager and of patched outputs against the original model run in higher
    precision (float64; float32 first for bfloat16/float16 models).

    "as accurate" when patched_err <= F64_FACTOR * eager_err (+ a tiny absolute floor for exact
    models). Runs a float64 copy of the model (unpatched); a model that cannot run in float64
    (dtype-specific code, memory) gives verdict "float64 run failed: ..." and the strict verdict stands.
    """
    import copy

    import torch

    # The more precise twin: float64 for float32 models; float32 first for half-precision ones
    # (three orders of magnitude finer, and kernels such as grouped_mm have no float64 path).
    half = any(t.dtype in (torch.float16, torch.bfloat16) for _, t in ref)
    ref64, errors = None, []
    for dt in ((torch.float32, torch.float64) if half else (torch.float64,)):
        try:
            m64 = copy.deepcopy(model).to(dt)
            inp64 = _to_dtype(inputs, dt)
            with torch.inference_mode():
                out = m64(**inp64) if isinstance(inp64, dict) else m64(*inp64)
            ref64 = [t for _, t in tensors_of(out)]
            del m64
            break
        except Exception as e:  # noqa: BLE001 - any failure leaves the strict verdict in place
            errors.append(f"{str(dt).replace('torch.', '')}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    if ref64 is None:
        return {"verdict": "float64 run failed: " + "; ".join(errors)}
    eager_err = patched_err = 0.0
    for (_, r), (_, g), t in zip(ref, got, ref64):
        if not r.is_floating_point():
            continue
        t = t.to(torch.float64)
        ok = torch.isfinite(t) & torch.isfinite(r.double()) & torch.isfinite(g.double())
        eager_err = max(eager_err, float((r.double() - t).abs()[ok].max()) if ok.any() else 0.0)
        patched_err = max(patched_err, float((g.double() - t).abs()[ok].max()) if ok.any() else 0.0)
    verdict = "as accurate" if patched_err <= F64_FACTOR * eager_err + 1e-12 else "less accurate than eager"
    return {"verdict": verdict, "eager_err": eager_err, "patched_err": patched_err}


def _to_dtype(x, dt):
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(dt) if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: _to_dtype(v, dt) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_dtype(v, dt) for v in x)
    return x


def judge(model, sets: list, ref: list, got: list, state: "State | None" = None) -> dict:
    """The verdict over every compared input set: element-wise first, and against a float64 run
    of the original (on the first set) when that fails."""
    cmp = {"max_abs_err": 0.0, "max_rel_err": 0.0, "within_tolerance": True, "notes": []}
    for i, (r, g) in enumerate(zip(ref, got)):
        c = compare(r, g)
        cmp["max_abs_err"] = max(cmp["max_abs_err"], c["max_abs_err"])
        cmp["max_rel_err"] = max(cmp["max_rel_err"], c["max_rel_err"])
        cmp["within_tolerance"] &= c["within_tolerance"]
        label = "example inputs" if i == 0 else f"fresh inputs {i}"
        cmp["notes"] += [f"{label}: {n}" for n in c["notes"]]
    if not cmp["within_tolerance"] and ref and got and (ref[0] or got[0]):
        if state is not None:
            state.restore()
        f64 = float64_judgement(model, fresh_copy(sets[0]), ref[0], got[0])
        cmp["float64_check"] = f64
        if f64.get("verdict") == "as accurate":
            cmp["within_tolerance"] = True
            cmp["notes"].append(f"accepted: against a float64 run, kforge's error "
                                f"{f64['patched_err']:.3g} <= {F64_FACTOR:g} x eager's own error "
                                f"{f64['eager_err']:.3g}")
        else:
            cmp["notes"].append(f"float64 check: {f64.get('verdict')}")
    return cmp
