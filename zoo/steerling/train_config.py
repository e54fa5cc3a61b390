"""The training configuration (`penrose steerling train`): presets and `TrainConfig`.

Apart from the training loop (penrose_zoo.steerling.train) so that checkpoint reading
(penrose_zoo.steerling.checkpoints, which checks a saved configuration field by field) sits
below the loop that writes checkpoints, not beside it in an import ring.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from penrose.errors import PenroseError

__all__ = ["PRESETS", "TrainConfig"]

# Model and concept-module sizes per preset; the known-concept count comes from the corpus.
PRESETS: dict[str, dict] = {
    "tiny": dict(
        model=dict(n_layers=1, n_head=2, n_kv_heads=1, n_embd=32, block_size=64, diff_block_size=8,
                   intermediate_size=64),
        concepts=dict(n_unknown_concepts=64, factorize_rank=8, topk_known=4, unknown_topk=4),
        seq_len=64, batch_size=8, lr=3e-3, warmup=10),
    "small": dict(
        model=dict(n_layers=2, n_head=4, n_kv_heads=2, n_embd=64, block_size=64, diff_block_size=16,
                   intermediate_size=192),
        concepts=dict(n_unknown_concepts=128, factorize_rank=16, topk_known=4, unknown_topk=8),
        seq_len=64, batch_size=16, lr=3e-3, warmup=50),
}


@dataclass
class TrainConfig:
    """What determines the trained weights (compared on resume)."""

    preset: str = "tiny"
    data: str = "fortunes"             # 'fortunes' or a directory of category files
    categories: list[str] | None = None  # category files to read (default: all)
    max_chunks: int = 0                # 0 = all; else a fixed random sample of training chunks
    variant: str = "causal"            # 'causal' (next-token) | 'block_causal' (masked diffusion)
    epsilon: bool = False              # keep ε (release form); False = pure bottleneck
    lambda_concept: float = 0.1
    lambda_indep: float = 1.0
    lambda_rec: float = 0.1
    lambda_bottleneck: float = 0.0     # with ε on: + λ · the token loss of h̄ = k̂ + û (the post's L_token)
    negative_weight: float = 1.0
    teacher_forcing_steps: int = 0
    tokenizer: str = "byte"            # 'byte' | 'bpe'
    bpe_vocab: int = 1024
    steps: int = 100
    seed: int = 0
    seq_len: int | None = None         # default: the preset's
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    val_batches: int = 8               # validation batches used for the periodic validation loss
    unknown_detach: bool = True        # the release: the unknown head reads h.detach(); False = reads h
    model_overrides: dict | None = None    # model-config fields replacing the preset's (scaling sizes)
    concept_overrides: dict | None = None  # concept-config fields replacing the preset's

    def check(self) -> None:
        """Every field of its type and in its range (penrose_zoo.validate), a PenroseArgumentError
        naming the field otherwise: counts whole and at least 1 (`steps`, `batch_size`,
        `val_batches`) or 0 (`max_chunks`, `teacher_forcing_steps`, `warmup`), `seq_len` at least 2,
        `bpe_vocab` at least 260, loss weights finite and not negative, `lr` and `grad_clip` above 0,
        the seed 0 to 2³² − 1. (A checkpoint's saved configuration is read by
        `checkpoints.read_train_state`.)"""
        from penrose_zoo.validate import flag, number, whole

        for name, low in (("steps", 1), ("max_chunks", 0), ("teacher_forcing_steps", 0), ("bpe_vocab", 260),
                          ("val_batches", 1)):
            whole(getattr(self, name), name, low=low)
        whole(self.seed, "seed", low=0, high=2**32 - 1)
        for name, low in (("seq_len", 2), ("batch_size", 1), ("warmup", 0)):
            if getattr(self, name) is not None:
                whole(getattr(self, name), name, low=low)
        for name in ("lambda_concept", "lambda_indep", "lambda_rec", "lambda_bottleneck", "negative_weight",
                     "weight_decay"):
            number(getattr(self, name), name, low=0)
        for name in ("lr", "grad_clip"):
            if name == "grad_clip" or self.lr is not None:
                number(getattr(self, name), name, low=0, low_open=True)
        for name in ("epsilon", "unknown_detach"):
            flag(getattr(self, name), name)
        if not isinstance(self.data, str) or not self.data:
            raise PenroseError(f"data must be 'fortunes' or a folder of category files, got {self.data!r}")
        if self.categories is not None and not (isinstance(self.categories, list)
                                                and all(isinstance(c, str) and c for c in self.categories)):
            raise PenroseError(f"categories must be a list of category file names, got {self.categories!r}")

    def resolved(self) -> "TrainConfig":
        if not isinstance(self.preset, str) or self.preset not in PRESETS:
            raise PenroseError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if self.variant not in ("causal", "block_causal"):
            raise PenroseError(f"variant must be 'causal' or 'block_causal', got {self.variant!r}")
        if self.tokenizer not in ("byte", "bpe"):
            raise PenroseError(f"tokenizer must be 'byte' or 'bpe', got {self.tokenizer!r}")
        self.check()
        p = PRESETS[self.preset]
        return dataclasses.replace(self, **{k: p[k] for k in ("seq_len", "batch_size", "lr", "warmup")
                                           if getattr(self, k) is None})
