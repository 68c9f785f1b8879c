"""The base of every position-encoding family: coordinates in, the encoding of each head out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..coords import COORDINATE_MODES
from ..tables import Build, RotaryTable, Table

__all__ = [
    "Build",
    "Family",
    "PairFamily",
    "Scaling",
    "axis_sections",
    "check_axis_dims",
    "equal_axis_dims",
    "head_angles",
]


@dataclass(frozen=True)
class Scaling:
    """The scaling (extrapolation) mode of a table and its per-axis scale factors s (1 at or below the reference
    grid), with the reference (training) grid it is measured against."""

    mode: str
    scales: tuple[float, ...]
    ref_grid: tuple[int, ...] | None = None


class Family(nn.Module):
    """Encodes token coordinates ``([B,] N, axes)`` as what attention applies (:meth:`encode`): a rotation per head (a
    :class:`~vit_rope.tables.RotaryTable`) or a bias on its logits (an :class:`~vit_rope.tables.AttentionBias`, or a
    :class:`~vit_rope.tables.ParabolicBias` of columns appended to q and k), built once by the table's constructor
    from the family's raw output (angles, generators, bias terms) and the pipeline's :class:`~vit_rope.tables.Build`
    (prefix rows, p-RoPE's turning pairs, the temperature, the dtype).

    A subclass sets ``name`` (its registry key) and declares what it is; the models, train.py and the tests read these
    declarations rather than lists of names:

    * ``scaling_modes``: the scaling modes it supports (every family has the coordinate modes; NTK and YaRN need
      a fixed frequency ladder);
    * ``rotary``: False for a bias on the logits; ``commutes``: its rotations commute, so attention is exactly
      relative (``<R(a) q, R(b) k>`` depends on ``b - a`` alone);
    * ``model_name``: timm then registers ``vit_<model_name>_{tiny,small,base}``;
    * ``needs_heads``: it works per head, so ``num_heads`` is required; ``min_axes``, ``max_axes``: the coordinate
      axes it takes; ``onnx``: its models export to ONNX (``matrix_exp`` and ``solve`` do not);
    * ``prefix_at_centre`` (an attribute an instance may set): prefix tokens get the encoding of the tokens' centre
      instead of none.

    ``depth=None`` shares one encoding across layers; with ``depth`` a learned family may learn one per layer and sets
    ``per_layer``.
    """

    name: ClassVar[str]
    scaling_modes: ClassVar[tuple[str, ...]] = COORDINATE_MODES
    rotary: ClassVar[bool] = True
    commutes: ClassVar[bool] = True
    model_name: ClassVar[str | None] = None
    needs_heads: ClassVar[bool] = False
    min_axes: ClassVar[int] = 1
    max_axes: ClassVar[int | None] = None
    onnx: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        num_heads: int | None = None,
        depth: int | None = None,
        ref_grid: Sequence[int] | None = None,  # the training grid at construction: some inits scale by it
    ) -> None:
        super().__init__()
        if axes < self.min_axes or (self.max_axes is not None and axes > self.max_axes):
            low, high = self.min_axes, self.max_axes
            takes = f"{low} or more" if high is None else str(low) if high == low else f"{low} to {high}"
            raise ValueError(f"family {self.name!r} takes {takes} coordinate axes, not axes={axes}")
        if self.needs_heads and num_heads is None:
            raise ValueError(f"freqs={self.name!r} works per head: pass num_heads")
        self.dim, self.axes, self.num_heads, self.depth = dim, axes, num_heads, depth
        self.ref_grid = None if ref_grid is None else tuple(ref_grid)
        self.per_layer = False
        self.prefix_at_centre = False  # prefix tokens (cls) encoded at the tokens' centre, not left unturned

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> Table:
        """The table of tokens at ``coords ([B,] N, axes)`` under ``scaling``, built as ``build`` says; per-sample
        coordinates (B, N, axes) give tables with a head dim, ``(B, heads | 1, N, ...)``, so that they broadcast over
        attention's heads."""
        raise NotImplementedError

    def learned_shape(self, per_layer: bool, per_head: bool = True) -> tuple[int, ...]:
        """The leading dims of a learned parameter, ``([layer,] heads | 1)``: one set a layer where ``per_layer`` and
        ``depth`` ask it (which ``self.per_layer`` then records), one a head where ``per_head``."""
        self.per_layer = per_layer and self.depth is not None
        return ((self.depth,) if self.per_layer else ()) + ((self.num_heads,) if per_head else (1,))

    def prune_layers(self, depth: int) -> None:
        """Keep the encodings of the first ``depth`` layers (a model's ``prune_intermediate_layers``)."""
        if self.per_layer:
            for name, p in list(self._parameters.items()):
                setattr(self, name, nn.Parameter(p[:depth].detach().clone(), requires_grad=p.requires_grad))
        self.depth = depth

    def temperature(self, scaling: Scaling) -> Tensor | None:
        """Per-pair factors that scale a table as it turns (YaRN's attention temperature), or None."""
        return None

    def rotating_pairs(self) -> Tensor | None:
        """p-RoPE's ``(dim // 2,)`` bool mask of the channel pairs that turn, or None (all turn, or no pairs)."""
        return None

    def extra_repr(self) -> str:
        return f"dim={self.dim}, axes={self.axes}, heads={self.num_heads}, per_layer={self.per_layer}"


class PairFamily(Family):
    """A family whose tables turn channel pairs: ``theta`` (the base of its frequency ladder), ``layout``
    (``"interleaved"`` pairs channels (2i, 2i+1), ``"half"`` pairs i with i + dim/2), the channels each axis turns
    (``axis_dims`` in grid axis order, or ``rotate_fraction`` of the channels in equal even sections), and the order of
    the sections (``grid_indexing``: ``"xy"``, the last axis first, RoPE-ViT's x then y; ``"ij"``, the first axis
    first, DINOv3's y then x — timm's names for the two).

    ``p`` is p-RoPE (Barbero et al., "Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR
    2025, arXiv 2410.06205): only the fraction p of the pairs with the highest frequencies keeps turning, the others
    are left unturned (cos 1, sin 0), to carry content the way NoPE channels do. The paper's rule, for one 1D ladder of
    n pairs: the ``floor(p · n)`` highest frequencies keep their values, the rest get frequency 0 (its Gemma code pads
    the ladder with infinite wavelengths). Here it applies to each of the family's ladders (:meth:`frequency_groups`:
    each axis's section by default, so that every axis keeps the same fraction of its own frequencies; one group where
    pairs mix axes, as goldengate and the plane of spiral), ranked by :meth:`pair_frequencies`: the norm of each
    pair's frequency vector, for a learned family its value at initialisation (by default axial RoPE's ladder of its
    section at ``theta``, which string, mixed and a gain on axial start from), so that which pairs turn never depends on
    training. Learned frequencies of the unturned pairs stay parameters but are masked out of the table (their
    gradient is zero). Unlike ``rotate_fraction``, which leaves channels unrotated by position in the layout, p picks
    pairs by frequency. The pipeline hands the mask (:meth:`rotating_pairs`) to every table built from angles
    (:meth:`~vit_rope.tables.RotaryTable.from_angles`), so a family written elsewhere takes ``p`` too; p = 1 turns every
    pair.
    """

    default_theta: ClassVar[float] = 100.0

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        theta: float | None = None,
        layout: str = "interleaved",
        axis_dims: Sequence[int] | None = None,
        rotate_fraction: float | None = None,
        grid_indexing: str = "xy",
        p: float = 1.0,
        **common,
    ) -> None:
        super().__init__(dim, axes, **common)
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0:
            raise ValueError(
                f"p={p!r} must be a number in (0, 1]: the fraction of channel pairs, the highest frequencies, that "
                "keep turning (p-RoPE; 1 turns them all)"
            )
        self.p = float(p)
        self._rotating: Tensor | None = None  # p-RoPE's mask of the pairs that turn, made on first use
        if grid_indexing not in ("xy", "ij"):
            raise ValueError(f"grid_indexing={grid_indexing!r}: choose 'xy' (the last axis first: x) or 'ij' (y first)")
        self.grid_indexing = grid_indexing
        theta = self.default_theta if theta is None else theta
        if isinstance(theta, bool) or not isinstance(theta, int | float):
            raise ValueError(f"theta={theta!r} must be a number (axial RoPE's is 100 for ViTs, 10000 for LLMs)")
        if not (theta > 0 and math.isfinite(theta)):
            raise ValueError(
                f"theta={theta} must be a positive finite number (axial RoPE's is 100 for ViTs, 10000 for language "
                "models)"
            )
        if layout not in ("interleaved", "half"):
            raise ValueError(f"layout={layout!r}: choose 'interleaved' (pairs 2i, 2i+1) or 'half' (i, i + dim/2)")
        self.theta, self.layout = float(theta), layout
        if axis_dims is None and rotate_fraction is None:
            axis_dims = self.default_axis_dims(dim, axes)
        self.axis_dims = check_axis_dims(dim, axes, axis_dims, rotate_fraction)

    @classmethod
    def default_axis_dims(cls, dim: int, axes: int) -> tuple[int, ...] | None:
        """The channels each axis turns when neither ``axis_dims`` nor ``rotate_fraction`` is given; None: equal even
        sections (a family whose split differs, such as spiral's or VideoRoPE's, overrides this)."""
        return None

    def sections(self) -> list[tuple[int, slice]]:
        """(axis, the pairs it turns) of each axis's section, in the family's ``grid_indexing`` order."""
        return axis_sections(self.axis_dims, last_first=self.grid_indexing == "xy")

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """A fixed family's ``(axes, dim // 2)`` frequency matrix (learned families override ``encode`` instead)."""
        raise NotImplementedError

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        """Each pair turns by ``coords · F[:, pair]`` under the frequency matrix F of this scaling."""
        angles = coords @ self.frequency_matrix(scaling).to(coords)  # (..., N, P)
        if coords.ndim == 3:  # per-sample positions (B, N, axes): a head dim to broadcast over
            angles = angles.unsqueeze(1)
        return RotaryTable.from_angles(angles, build, layout=self.layout)

    # ------------------------------------------------------------------------------------------------ p-RoPE
    def frequency_groups(self) -> list[Tensor]:
        """The pairs of each frequency ladder that p-RoPE cuts on its own: by default each axis's section."""
        return [torch.arange(pairs.start, pairs.stop) for _, pairs in self.sections()]

    def pair_frequencies(self) -> Tensor:
        """Each pair's frequency, ``(dim // 2,)`` float64, as p-RoPE ranks them: the norm of its frequency vector (the
        largest over heads) for a fixed family; for a learned one, axial RoPE's ladder of each section at ``theta``,
        the value its frequencies start from (families that start elsewhere override this)."""
        if type(self).frequency_matrix is not PairFamily.frequency_matrix:
            F = self.frequency_matrix()  # ([heads,] axes, P)
            return F.norm(dim=-2).reshape(-1, F.shape[-1]).amax(0)
        f = torch.zeros(self.dim // 2, dtype=torch.float64)
        for axis, pairs in self.sections():
            d = self.axis_dims[axis]
            f[pairs] = self.theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        return f

    def rotating_pairs(self) -> Tensor | None:
        """p-RoPE's ``(dim // 2,)`` bool mask of the pairs that turn: in each group the ``floor(p · n)`` pairs of the
        highest frequencies (ties to the earlier pair); everything outside the groups turns. None for p = 1."""
        if self.p == 1.0:
            return None
        if self._rotating is None:
            turning = torch.ones(self.dim // 2, dtype=torch.bool)
            f = self.pair_frequencies()
            for group in self.frequency_groups():
                order = torch.sort(-f[group], stable=True).indices  # highest first, ties in pair order
                turning[group[order[math.floor(self.p * len(group)) :]]] = False
            self._rotating = turning
        return self._rotating

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, axis_dims={self.axis_dims}, theta={self.theta}, layout={self.layout}, " + (
            f"grid_indexing={self.grid_indexing}" + (f", p={self.p}" if self.p < 1 else "")
        )


def axis_sections(axis_dims: Sequence[int], start: int = 0, last_first: bool = True) -> list[tuple[int, slice]]:
    """(axis, the pairs it turns) of each axis's section, laid out from the last grid axis to the first (2D: x then
    y; ``last_first=False``: the other way), from pair ``start`` on."""
    out = []
    for axis in reversed(range(len(axis_dims))) if last_first else range(len(axis_dims)):
        out.append((axis, slice(start, start + axis_dims[axis] // 2)))
        start += axis_dims[axis] // 2
    return out


def equal_axis_dims(dim: int, axes: int, rotate_fraction: float = 1.0) -> tuple[int, ...]:
    """Equal even sections, one per axis; the remainder stays unrotated (64 over 3 axes → 20/20/20 + 4, V-JEPA 2)."""
    per_axis = 2 * ((int(dim * rotate_fraction) // axes) // 2)
    return (per_axis,) * axes


def check_axis_dims(
    dim: int, axes: int, axis_dims: Sequence[int] | None, rotate_fraction: float | None
) -> tuple[int, ...]:
    """The channels each axis turns: ``axis_dims`` checked, or the equal split of ``rotate_fraction`` of dim."""
    if axis_dims is not None and rotate_fraction not in (None, 1.0):
        raise ValueError("give either axis_dims or rotate_fraction, not both")
    if axis_dims is None:
        fraction = 1.0 if rotate_fraction is None else rotate_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 < fraction <= 1.0:
            raise ValueError(f"rotate_fraction={rotate_fraction!r} must be a number in (0, 1]")
        dims = equal_axis_dims(dim, axes, fraction)
        if dims[0] == 0:
            raise ValueError(
                f"dim={dim} (rotate_fraction={fraction}) cannot be split into even sections for {axes} axes; use a "
                f"head dim of at least {2 * axes} or pass axis_dims with one even size per axis"
            )
        return dims
    dims = tuple(int(d) for d in axis_dims)
    if len(dims) != axes:
        raise ValueError(f"axis_dims={dims} has {len(dims)} entries for {axes} axes; give one each")
    if any(d <= 0 or d % 2 for d in dims) or sum(dims) > dim:
        raise ValueError(
            f"axis_dims={dims} cannot split dim={dim}: each section must be even and positive, and together at most "
            f"dim (e.g. axis_dims={equal_axis_dims(dim, axes)})"
        )
    return dims


def head_angles(coords: Tensor, F: Tensor) -> Tensor:
    """Angles of coordinates ``([B,] N, axes)`` under per-head frequencies ``F ([layer,] heads, axes, P)``:
    ``([B,] [layer,] heads, N, P)``."""
    if coords.ndim == 3:  # (B, N, axes) → (B, 1.., N, axes), to broadcast over F's leading dims
        coords = coords.view(coords.shape[0], *([1] * (F.ndim - 2)), *coords.shape[1:])
    return coords @ F
