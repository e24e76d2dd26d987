"""The model sizes: shapes and analytic parameter counts, without torch.

Kept apart from ``profkit.workload.model`` so that commands which only need a size's shape (FLOP
counts, reports, config validation) don't import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from profkit.errors import BadInput


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one model size. Parameter counts are analytic (no weights allocated)."""

    name: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @property
    def params(self) -> int:
        """All parameters: embedding, blocks, final norm and LM head."""
        return self.non_embedding_params + self.d_model * self.vocab_size

    @property
    def non_embedding_params(self) -> int:
        """Parameters without the LM head (the course's convention for "model size")."""
        d, f = self.d_model, self.d_ff
        per_layer = 4 * d * d + 3 * d * f + 2 * d  # q,k,v,o + w1,w2,w3 + two RMSNorm weights
        return self.vocab_size * d + self.num_layers * per_layer + d

    def with_vocab(self, vocab_size: int) -> ModelSpec:
        return ModelSpec(
            self.name, self.d_model, self.d_ff, self.num_layers, self.num_heads, vocab_size
        )

    def as_row(self) -> dict[str, int | str]:
        row: dict[str, int | str] = {"size": self.name, **asdict(self)}
        del row["name"]
        row["params"] = self.params
        row["non_embedding_params"] = self.non_embedding_params
        return row


SIZES: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("tiny", 64, 256, 2, 4),
        ModelSpec("small", 768, 3072, 12, 12),
        ModelSpec("medium", 1024, 4096, 24, 16),
        ModelSpec("large", 1280, 5120, 36, 20),
        ModelSpec("xl", 1600, 6400, 48, 25),
        ModelSpec("2.7B", 2560, 10240, 32, 32),
        ModelSpec("10B", 4608, 12288, 50, 36),
    )
}
COURSE_SIZES = ("small", "medium", "large", "xl", "2.7B")


def get_spec(size: str, vocab_size: int = 10_000) -> ModelSpec:
    if size not in SIZES:
        raise BadInput(f"unknown size {size!r}; choose one of: {', '.join(SIZES)}")
    spec = SIZES[size]
    return spec if vocab_size == spec.vocab_size else spec.with_vocab(vocab_size)


def sizes() -> list[dict[str, int | str]]:
    """Every size with its shapes and parameter counts (the ``profkit sizes`` contract)."""
    return [spec.as_row() for spec in SIZES.values()]
