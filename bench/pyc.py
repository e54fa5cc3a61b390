"""PyC (`pytorch-concepts`, import `torch_concepts`) and the zoo side by side on the toy concept sets.

    python bench/pyc.py                        # 4 sets × 3 seeds, 100 epochs (several minutes on one CPU thread)
    python bench/pyc.py --quick                # 1 seed, 30 epochs, fewer rows (PENROSE_REDUCED=1 does the same)
    python bench/pyc.py --sets trigonometry --seeds 0 1 2 --epochs 100
    python bench/pyc.py --sets dot xor --models cbm_int cem --randint example
    python bench/pyc.py --data mine.npz        # one's own rows: arrays x, c (binary), y (binary)
    python bench/pyc.py --sets checkmark --models graph c2bm graph_input   # the graph models
    python bench/pyc.py --backbone             # a CNN backbone, fine-tuned, on image-like input

Set-up: PyC is an optional dependency, imported only here: `pip install --pre pytorch-concepts`
(1.0.0a7 at the time of writing; it keeps the installed torch). Without it the script still runs
the zoo's side and says that PyC is missing.

`--data FILE.npz ...` adds sets of one's own (`penrose_zoo.data.load_concept_arrays`: arrays `x`
(n, f), `c` (n, k) binary concepts, `y` (n,) binary task, optionally `concept_names`; split per seed
as the toy sets are), run after the toy sets given with `--sets` (none by default with `--data`).

Both libraries get the same rows (`penrose_zoo.data.toy_concepts(name, n, seed)`, which gives PyC's
own rows and split for XOR, trigonometry and checkmark, and the CEM authors' dot), the same
seeds, the same optimiser (Adam, lr 1e-2, batch 256, the same number of epochs) and the same
loss: PyC trains on the mean binary cross-entropy over the k concept columns and the task column
(one task logit), i.e. task loss + the sum of the concept losses, which is the zoo's
`concept_weight = k` with a binary task (`task='binary'`, r = 1: one logit, BCE) up to a constant
factor. Models: the concept bottleneck (linear concept encoder on the input, sigmoid
probabilities, linear task predictor), the same trained with RandInt 0.25 (`cbm_int`: training-
time interventions, PyC's teacher-forcing `p_int`) and the concept embedding model (embedding size
8, RandInt 0.25); the zoo's hybrid bottleneck (8 extra units) has no PyC
counterpart and is printed for reference. RandInt replaces the predicted concept probabilities
(what the task predictor reads) by the 0/1 labels during training only; the concept loss still
sees every prediction. PyC draws once per variable, and by default its homogeneous concepts are
one plate variable, so it forces all of an example's concepts together; `--randint concept` (the
default) builds PyC's model with one variable per concept (`plate=False`), which draws per
concept and example as the CEM paper's RandInt and the zoo's default do; `--randint example`
keeps PyC's default layout and trains the zoo with `randint='example'`. PyC trains either in a plain-PyTorch loop
(`--pyc-loop plain`, the default and the fastest way it offers: `model(query=..., input=x)`) or
the way its documentation trains, with a Lightning Trainer (`--pyc-loop lightning`).

Measured on the test split: task accuracy, concept accuracy (threshold 0.5), the intervention
curve (random policy, ground truth, one more concept each step; the same per-example orders for
both) and its score (area under the curve), and the training time (the loop alone, the least of
`--repeats` runs on fresh models, PyC's and the zoo's alternating, with the garbage collector
paused as timeit does, as the CPU time of this process: on a shared machine other jobs inflate wall-clock time by different amounts for
each run; with one torch thread, the CPU time is the wall time an idle machine would show). The
zoo trains through the diagrams' generated backward (`fit(backward='auto')`, penrose.gradients);
the CBM row also times it through autograd, and the same CBM written directly in torch.

Graph models (`--models graph c2bm graph_input`): the zoo's `ConceptGraphModel` against PyC's
`GraphConceptBottleneckModel`, `CausallyReliableCBM` against PyC's
`CausallyReliableConceptBottleneckModel` (embedding and hypernetwork sizes 8, PyC's defaults), over
the set's concept graph with the task as a node (checkmark: C from B, the task from A and C; the
other toy sets have no edges between concepts, so the task reads every concept), no RandInt; and
the zoo's `InputConceptGraphModel` (every concept also reads the input; no PyC counterpart). After
each graph row on a set with edges, `do(parent) flips child` gives the share of test examples whose
child (thresholded at 0.5) differs between the parent set to 0 and to 1, in both libraries.

`--backbone`: image-like input (each row's features through a fixed random projection to a 1×8×8
image, the same for both), a small CNN (conv 3×3 → ReLU → 2×2 pooling → linear, 8 features) in
front of the CBM, fine-tuned with it in both libraries (the same initial weights). The zoo trains a
fine-tuned backbone through autograd (its generated backward covers the diagram, not a module in
front of it); a `cached` backbone (fixed, run once) trains the diagram through the generated step
and is timed beside it (`cbm` row, `cached` column).

The spread of the repeats: `train s` is the least CPU time of the repeats (mean over seeds), `max s`
the most; a large gap says the machine was busy during some of them.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from common import reduced, threads_note  # noqa: E402

import penrose_zoo  # noqa: E402
from penrose_zoo.data import TOY_SETS, DataError, load_concept_arrays, toy_concepts  # noqa: E402
from penrose_zoo.interventions import RandomPolicy, intervention_curve, intervention_masks, intervention_score  # noqa: E402

BATCH, LR = 256, 1e-2
P_INT = 0.25  # RandInt's rate (cbm_int, cem)
MODELS = ("cbm", "cbm_int", "cem", "hybrid")
GRAPH_MODELS = ("graph", "c2bm", "graph_input")
NO_PYC = ("hybrid", "graph_input")  # the zoo's models without a PyC counterpart
IMAGE = 8  # --backbone: the side of the 1×IMAGE×IMAGE images


def have_pyc() -> bool:
    try:
        import torch_concepts  # noqa: F401
    except ImportError:
        return False
    return True


# ---- the zoo ----------------------------------------------------------------------------------


def graph_of(data) -> dict:
    """The set's concept graph with the task as a node: {child: parents}, the task named by the
    set (its parents: the set's `task_parents`, or every concept)."""
    return {**{c: tuple(ps) for c, ps in data.parents.items() if ps},
            data.task_names[0]: tuple(data.task_parents or data.concept_names)}


def backbone_net(seed: int) -> torch.nn.Module:
    """--backbone's CNN: conv 3×3 (4 channels) → ReLU → 2×2 average pooling → linear to 8."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(16, 8))


def as_images(data, seed: int):
    """The set with each row's features projected to a 1×8×8 image (a fixed random projection)."""
    import dataclasses

    g = torch.Generator().manual_seed(1000 + seed)
    proj = torch.randn(data.x_train.shape[1], IMAGE * IMAGE, generator=g)
    return dataclasses.replace(data, **{name: (getattr(data, name) @ proj).reshape(-1, 1, IMAGE, IMAGE)
                                        for name in ("x_train", "x_val", "x_test")})


def zoo_model(kind: str, f: int, k: int, seed: int, randint: str = "concept", data=None, backbone: str | None = None):
    """The zoo's side: one task logit trained with BCE (`task='binary'`, r = 1), as PyC's models
    have; the concept loss weighs the k concepts against the task as PyC's mean BCE does.
    randint: RandInt's draw per concept and example, or per example (see `pyc_model`); data: the
    set (the graph models read its graph); backbone: 'finetune' or 'cached' puts `backbone_net`
    in front (f is then its 8 features)."""
    common = dict(f=f, k=k, r=1, task="binary", concept_weight=float(k), seed=seed)
    if backbone is not None:
        common.update(f=8, backbone=backbone_net(seed), backbone_mode=backbone)
    if kind in GRAPH_MODELS:
        graph = graph_of(data)
        names = list(data.concept_names)
        kw = dict(f=f, r=1, task="binary", concept_weight=float(k), seed=seed, concept_names=names,
                  task_name=data.task_names[0])
        if kind == "graph_input":
            task = graph.pop(data.task_names[0])
            return penrose_zoo.InputConceptGraphModel(k=k, parents=graph, task_parents=task,
                                                      **{n: v for n, v in kw.items() if n != "task_name"})
        cls = penrose_zoo.ConceptGraphModel if kind == "graph" else penrose_zoo.CausallyReliableCBM
        return cls(parents=graph, **kw)
    if kind == "cbm":
        return penrose_zoo.ConceptBottleneckModel(**common)
    if kind == "cbm_int":
        return penrose_zoo.ConceptBottleneckModel(**common, p_int=P_INT, randint=randint)
    if kind == "cem":
        return penrose_zoo.ConceptEmbeddingModel(e=8, p_int=P_INT, randint=randint, **common)
    if kind == "hybrid":
        return penrose_zoo.HybridConceptBottleneckModel(j=8, **common)
    raise ValueError(kind)


def timed(build, train):
    """(the model, the CPU seconds of `train(build())`), the training run with the garbage
    collector paused (as timeit does); both libraries are timed this way, and `main` keeps the
    least of `--repeats` such runs, PyC's and the zoo's alternating."""
    model = build()
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        train(model)
        return model, time.process_time() - t0
    finally:
        gc.enable()


def fastest(runs) -> dict:
    """The first run's results with the least training time of all the runs (the same seed), and
    the most (`max_seconds`: the spread of the repeats)."""
    return {**runs[0], "seconds": min(r["seconds"] for r in runs), "max_seconds": max(r["seconds"] for r in runs)}


def flip_rate(child_given) -> float | None:
    """The share of examples whose child (thresholded at 0.5) differs between do(parent = 0) and
    do(parent = 1); child_given(v): the child's probability with the parent set to v."""
    return ((child_given(0.0) > 0.5) != (child_given(1.0) > 0.5)).double().mean().item()


def first_edge(data):
    """(parent, child) of the set's first edge between concepts, or None."""
    return next(((ps[0], c) for c, ps in data.parents.items() if ps), None)


def run_zoo(kind, data, seed, epochs, fractions, randint="concept", backward="auto", backbone=None):
    def build():
        return zoo_model(kind, data.x_train.shape[1], data.c_train.shape[1], seed, randint, data, backbone)

    def train(model):
        model.fit(data.train_tuple(), epochs=epochs, batch_size=BATCH, lr=LR, seed=seed, progress=False, backward=backward)

    model, seconds = timed(build, train)
    curve = intervention_curve(model, data.test_tuple(), RandomPolicy(seed), fractions)
    flips = None
    edge = first_edge(data)
    if kind in GRAPH_MODELS and edge is not None:
        parent, child = edge
        j = list(data.concept_names).index(child)
        model.eval()
        with torch.no_grad():
            flips = flip_rate(lambda v: model.intervene(data.x_test, [parent], [v]).c[:, j])
    return {"acc": curve.accuracy[0], "concept_acc": curve.concept_accuracy, "curve": curve.accuracy,
            "score": curve.score, "seconds": seconds, "flips": flips}


# ---- PyC --------------------------------------------------------------------------------------


def pyc_model(kind: str, f: int, names: list[str], lightning: bool = False, randint: str = "concept", graph=None,
              backbone: torch.nn.Module | None = None):
    """PyC's model of `kind`. RandInt (`cbm_int`, `cem`): PyC forces each *variable* to its label
    with probability p_int, and by default it gathers homogeneous concepts into one plate
    variable, so all of an example's concepts are forced together (one draw per example).
    randint='concept' (the default here) builds one variable per concept (`plate=False`), which
    gives RandInt as the CEM paper defines it and as the zoo trains: one draw per concept and
    example; randint='example' keeps PyC's default layout."""
    from torch_concepts.annotations import Annotations
    from torch_concepts.nn import ConceptBottleneckModel, ConceptEmbeddingModel, ConceptLoss

    ann = Annotations(labels=names, cardinalities=[1] * len(names), types=["binary"] * len(names))
    extra: dict = {}
    if backbone is not None:
        extra.update(backbone=backbone, latent_size=8)
        f = (1, IMAGE, IMAGE)  # type: ignore[assignment]
    if kind in GRAPH_MODELS:  # graph: {child: parents} over `names` (the task last)
        from torch_concepts.concept_graph import ConceptGraph
        from torch_concepts.nn import GraphConceptBottleneckModel
        from torch_concepts.nn.modules.high.models.c2bm import CausallyReliableConceptBottleneckModel

        adj = torch.zeros(len(names), len(names))
        for child, ps in (graph or {}).items():
            for parent in ps:
                adj[names.index(parent), names.index(child)] = 1.0
        cls = GraphConceptBottleneckModel if kind == "graph" else CausallyReliableConceptBottleneckModel
        return cls(input_size=f, annotations=ann, graph=ConceptGraph(adj, node_names=list(names)), **extra)
    if lightning:
        extra = dict(lightning=True, loss=ConceptLoss(binary=torch.nn.BCEWithLogitsLoss()),
                     optim_class=torch.optim.Adam, optim_kwargs={"lr": LR})
    if kind in ("cbm_int", "cem"):
        extra["train_inference_kwargs"] = {"p_int": P_INT}
        if randint == "concept":
            extra["plate"] = False
    if kind in ("cbm", "cbm_int"):
        return ConceptBottleneckModel(input_size=f, annotations=ann, task_names=[names[-1]], **extra)
    if kind == "cem":
        return ConceptEmbeddingModel(input_size=f, annotations=ann, task_names=[names[-1]], embedding_size=8, **extra)
    raise ValueError(kind)


def _logits(out):
    logits = out.logits
    return getattr(logits, "tensor", logits)


def _train_plain(model, x, target, seed, epochs):
    """PyC's models as plain torch modules, in a hand-written loop."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), BATCH):
            idx = order[i:i + BATCH]
            opt.zero_grad(set_to_none=True)
            query = model.fully_observed_query(target[idx])  # ground truth: teacher forcing where p_int > 0
            out = model(query=query, input=x[idx])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(_logits(out), target[idx])
            loss.backward()
            opt.step()


def _train_lightning(model, ann, x, target, seed, epochs):
    """PyC's models the way its documentation trains them: a Lightning Trainer (no logger, no
    checkpoints, no progress bar), its ConceptLoss with BCE for the binary columns."""
    import logging
    import warnings

    import pytorch_lightning as pl
    from torch_concepts.tensor import AnnotatedTensor

    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    def collate(rows):
        idx = torch.tensor(rows)
        return {"inputs": {"x": x[idx]}, "concepts": {"c": AnnotatedTensor(target[idx], ann, 1)}}

    loader = torch.utils.data.DataLoader(list(range(len(x))), batch_size=BATCH, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(seed))
    trainer = pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, loader)


def run_pyc(kind, data, seed, epochs, fractions, loop="plain", randint="concept", backbone=None):
    k = data.c_train.shape[1]
    names = list(data.concept_names) + [data.task_names[0]]
    x, c, y = data.train_tuple()
    target = torch.cat([c, y[:, None].float()], 1)

    def build():
        net = backbone_net(seed) if backbone else None
        torch.manual_seed(seed)
        return pyc_model(kind, data.x_train.shape[1], names, lightning=(loop == "lightning"), randint=randint,
                         graph=graph_of(data) if kind in GRAPH_MODELS else None, backbone=net)

    def train(model):
        if loop == "lightning":
            _train_lightning(model, model.concept_annotations, x, target, seed, epochs)
        else:
            _train_plain(model, x, target, seed, epochs)

    model, seconds = timed(build, train)
    model.eval()
    xt, ct, yt = data.test_tuple()
    with torch.no_grad():
        logits = _logits(model(query=names, input=xt))
        probs = torch.sigmoid(logits[:, :k])
        concept_acc = ((probs > 0.5) == (ct > 0.5)).double().mean().item()
        ranking = RandomPolicy(seed).ranking(None, xt, ct, None)
        curve = []
        for fraction in fractions:
            do = intervention_masks(ranking, fraction)
            values = torch.where(do, ct, probs)
            evidence = {n: values[:, i:i + 1] for i, n in enumerate(names[:k])}
            y_logit = _logits(model(query=[names[-1]], evidence=evidence, input=xt))[:, -1]
            curve.append(((y_logit > 0).long() == yt).double().mean().item())
        flips = None
        edge = first_edge(data)
        if kind in GRAPH_MODELS and edge is not None:
            parent, child = edge

            def child_given(v):
                out = model(query=[child], evidence={parent: torch.full((len(xt), 1), v)}, input=xt)
                return torch.sigmoid(_logits(out)[:, 0])

            flips = flip_rate(child_given)
    return {"acc": curve[0], "concept_acc": concept_acc, "curve": tuple(curve),
            "score": intervention_score(curve, fractions), "seconds": seconds, "flips": flips}


# ---- a hand-written torch loop (the floor of eager PyTorch for these models) ----------------------


def run_torch(data, seed, epochs):
    """The concept bottleneck written directly in torch (nn.Linear encoder, sigmoid, nn.Linear task
    head), trained the plain way with torch's fused Adam on pre-shuffled tensors: what a step of
    eager PyTorch costs for this model, without any library around it."""
    f, k = data.x_train.shape[1], data.c_train.shape[1]
    x, c, y = data.train_tuple()

    def build():
        torch.manual_seed(seed)
        return torch.nn.Linear(f, k), torch.nn.Linear(k, 2)

    def train(model):
        encoder, head = model
        opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=LR, fused=True)
        g = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=g)
            xs, cs, ys = x[order], c[order], y[order]
            for i in range(0, len(x), BATCH):
                opt.zero_grad()
                logits = encoder(xs[i:i + BATCH])
                loss = (torch.nn.functional.cross_entropy(head(torch.sigmoid(logits)), ys[i:i + BATCH])
                        + k * torch.nn.functional.binary_cross_entropy_with_logits(logits, cs[i:i + BATCH]))
                loss.backward()
                opt.step()

    return timed(build, train)[1]


def warm_up(pyc: bool, loop: str, models=(), backbone: bool = False) -> None:
    """One untimed epoch of every model in both libraries: lazy imports (building the first torch
    optimiser imports torch._dynamo, seconds) and first-call costs stay out of the timings."""
    data = toy_concepts("xor", n=300, seed=0)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    for kind in ("cbm", "cbm_int", "cem", *(m for m in models if m in GRAPH_MODELS)):
        run_zoo(kind, data, 0, 1, (0.0, 1.0))
        if pyc and kind not in NO_PYC:
            run_pyc(kind, data, 0, 1, (0.0, 1.0), loop)
    if backbone:
        images = as_images(data, 0)
        for mode in ("finetune", "cached"):
            run_zoo("cbm", images, 0, 1, (0.0, 1.0), backbone=mode)
        if pyc:
            run_pyc("cbm", images, 0, 1, (0.0, 1.0), loop, backbone=True)
    run_torch(data, 0, 1)
    run_zoo("cbm", data, 0, 1, (0.0, 1.0), backward="autograd")


# ---- main -------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=None, choices=TOY_SETS)
    ap.add_argument("--data", nargs="+", default=[], metavar="FILE.npz",
                    help="sets of one's own: .npz files of arrays x, c (binary concepts), y (binary task)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None, help="rows generated per set (default 3000; 70 %% train)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", default=None, choices=MODELS + GRAPH_MODELS,
                    help=f"default: {' '.join(MODELS)} (cbm with --backbone)")
    ap.add_argument("--backbone", action="store_true",
                    help="image-like input through a small CNN fine-tuned with the model, in both libraries")
    ap.add_argument("--randint", choices=("concept", "example"), default="concept",
                    help="RandInt's draw, on both sides: per concept and example (the CEM paper's; PyC "
                         "with plate=False), or per example (PyC's default plate layout)")
    ap.add_argument("--pyc-loop", choices=("plain", "lightning"), default="plain",
                    help="train PyC in a hand-written loop (default) or with its Lightning Trainer")
    ap.add_argument("--repeats", type=int, default=None,
                    help="trainings per timing, the least CPU time reported (default 3; 1 with --quick)")
    args = ap.parse_args(argv)
    quick = args.quick or reduced()
    seeds = args.seeds or ([0] if quick else [0, 1, 2])
    epochs = args.epochs or (30 if quick else 100)
    rows = args.rows or (1000 if quick else 3000)
    args.repeats = args.repeats or (1 if quick else 3)
    args.models = args.models or (["cbm"] if args.backbone else list(MODELS))
    if args.backbone and any(m in GRAPH_MODELS for m in args.models):
        print("bench/pyc.py: --backbone runs the bottlenecks and the embedding model, not the graph models", file=sys.stderr)
        return 2
    sets = args.sets if args.sets is not None else ([] if args.data else list(TOY_SETS))
    # per set, its data of a seed, made (or read) once: every model and the CBM's floor runs use it
    loaders = {name: functools.cache(lambda seed, name=name: toy_concepts(name, n=rows, seed=seed)) for name in sets}
    for path in args.data:
        try:
            loaded = load_concept_arrays(path)
        except DataError as e:
            print(f"bench/pyc.py: {e}", file=sys.stderr)
            return 2
        if loaded.name in loaders:
            print(f"bench/pyc.py: two sets named {loaded.name!r}", file=sys.stderr)
            return 2
        loaders[loaded.name] = functools.cache(lambda seed, path=path: load_concept_arrays(path, seed))
    torch.set_num_threads(args.threads)
    pyc = have_pyc()
    print(f"PyC vs penrose zoo on {', '.join(loaders) or 'no set'}: {rows} rows per toy set (70/10/20 train/val/test), seeds {seeds}, "
          f"{epochs} epochs, Adam lr {LR}, batch {BATCH}, RandInt {P_INT} per {args.randint}; {threads_note()}; "
          f"training time: the least CPU seconds of {args.repeats} run(s), garbage collector paused")
    if not pyc:
        print("PyC (torch_concepts) is not installed: `pip install --pre pytorch-concepts`; zoo side only")
    if pyc:
        print(f"PyC trains in its {'Lightning Trainer' if args.pyc_loop == 'lightning' else 'plain-torch loop'}")
    print("means over seeds, test split; curve = task accuracy with 0, 1, …, k concepts set (random order, ground truth)")
    if args.backbone:
        print(f"backbone: each row projected to a 1×{IMAGE}×{IMAGE} image, a CNN (conv 3×3, 4 channels, ReLU, "
              "2×2 pooling, linear to 8) fine-tuned with the model in both libraries")
    warm_up(pyc, args.pyc_loop, args.models, args.backbone)
    head = (f"{'set':<13} {'model':<11} {'lib':<8} {'task acc':>8} {'concept':>8} {'score':>6} {'train s':>8} {'max s':>7}"
            "  curve")
    print(head)
    setting = "backbone" if args.backbone else "toy heads"
    ratios: dict[str, list[float]] = {}
    floor_ratios = []
    for name, load in loaders.items():
        for kind in args.models:
            results = {"penrose": [], "pyc": []}
            for seed in seeds:
                data = as_images(load(seed), seed) if args.backbone else load(seed)
                k = data.c_train.shape[1]
                fractions = tuple(i / k for i in range(k + 1))
                runs: dict = {"penrose": [], "pyc": []}
                for _ in range(args.repeats):  # alternating, so a slow spell of the machine hits both
                    runs["penrose"].append(run_zoo(kind, data, seed, epochs, fractions, args.randint,
                                                   backbone="finetune" if args.backbone else None))
                    if pyc and kind not in NO_PYC:
                        runs["pyc"].append(run_pyc(kind, data, seed, epochs, fractions, args.pyc_loop, args.randint,
                                                   backbone=args.backbone))
                for lib, rs in runs.items():
                    if rs:
                        results[lib].append(fastest(rs))
            for lib, rs in results.items():
                if not rs:
                    continue
                mean = {m: statistics.fmean(r[m] for r in rs)
                        for m in ("acc", "concept_acc", "score", "seconds", "max_seconds")}
                curve = [statistics.fmean(r["curve"][i] for r in rs) for i in range(len(rs[0]["curve"]))]
                print(f"{name:<13} {kind:<11} {lib:<8} {mean['acc']:8.3f} {mean['concept_acc']:8.3f} {mean['score']:6.3f} "
                      f"{mean['seconds']:8.2f} {mean['max_seconds']:7.2f}  " + " ".join(f"{a:.3f}" for a in curve), flush=True)
            if any(r["flips"] is not None for rs in results.values() for r in rs):
                parent, child = first_edge(load(seeds[0]))
                rates = ", ".join(f"{lib} {statistics.fmean(r['flips'] for r in rs):.3f}" for lib, rs in results.items() if rs)
                print(f"{'':<13} {kind:<11} do({parent}) flips {child}: {rates}", flush=True)
            if results["pyc"]:
                pyc_s = statistics.fmean(r["seconds"] for r in results["pyc"])
                ratio = pyc_s / statistics.fmean(r["seconds"] for r in results["penrose"])
                ratios.setdefault("graph models" if kind in GRAPH_MODELS else setting, []).append(ratio)
                line = f"{'':<13} {kind:<11} training time PyC / penrose: {ratio:.1f}×"
                if kind == "cbm" and args.backbone:
                    cached_s = statistics.fmean(min(run_zoo(kind, as_images(load(s), s), s, epochs, fractions, args.randint,
                                                            backbone="cached")["seconds"] for _ in range(args.repeats))
                                                for s in seeds)
                    line += f"; PyC / the zoo with the backbone cached: {pyc_s / cached_s:.1f}× ({cached_s:.2f} s)"
                elif kind == "cbm":
                    torch_s = statistics.fmean(min(run_torch(load(s), s, epochs)
                                                   for _ in range(args.repeats)) for s in seeds)
                    autograd_s = statistics.fmean(min(run_zoo(kind, load(s), s, epochs, fractions,
                                                              args.randint, "autograd")["seconds"] for _ in range(args.repeats))
                                                  for s in seeds)
                    floor_ratios.append(pyc_s / torch_s)
                    line += (f"; PyC / hand-written torch loop: {pyc_s / torch_s:.1f}× ({torch_s:.2f} s)"
                             f"; PyC / the zoo through autograd: {pyc_s / autograd_s:.1f}× ({autograd_s:.2f} s)")
                print(line, flush=True)
    for where, rs in ratios.items():
        print(f"training speed-up over PyC ({where}): min {min(rs):.1f}×, median {statistics.median(rs):.1f}×"
              + (" (target ≥ 5×)" if where == "toy heads" else ""))
    if floor_ratios:
        print(f"a hand-written torch loop of the CBM over PyC's: median {statistics.median(floor_ratios):.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
