"""Position encodings over any number of axes: coordinates → a family → the table each head's attention applies.

:class:`PositionEncoding` is the pipeline every family shares: the tokens' coordinates (from a grid, row-major, or
given per token), the coordinate-level scaling modes and augmentation (:mod:`vit_rope.coords`), the family
(:mod:`vit_rope.families`, by its registry name), and what every table gets besides (:class:`~vit_rope.tables.Build`:
prefix rows for cls and register tokens, p-RoPE's turning pairs, YaRN's temperature, the dtype). Calling it gives the
table. :class:`RotaryEmbedding` is the same for the rotary families, and calling it rotates a tensor.

Tables are computed in float64 (learned parameters enter in float32 at least, float64 for float64 inputs) and kept in
float32 (float64 for float64 inputs), also under autocast; they are built per call and never stored in checkpoints,
so a model loads at any resolution.
"""

import math
import operator
from collections.abc import Sequence
from dataclasses import replace

import torch
from timm.layers._fx import register_notrace_module
from torch import Tensor, nn

from .coords import augment, grid_coordinates, scale_factors, scaled_coordinates
from .families import FAMILIES, Scaling, create_family
from .kernels import fused
from .tables import Build, RotaryTable, Table, outside_autocast

__all__ = ["SCALING_MODES", "PositionEncoding", "RotaryEmbedding"]

SCALING_MODES: tuple[str, ...] = ("none", "pi", "ntk", "yarn", "normalized")  # every mode some family supports


def _as_tuple(value: float | Sequence[float], n: int, name: str) -> tuple[float, ...]:
    values = (value,) * n if isinstance(value, int | float | str) else tuple(value)
    if any(isinstance(v, bool | str) or not isinstance(v, int | float) for v in values):
        raise ValueError(f"{name}={value!r} must be a number or one number per axis")
    value = tuple(float(v) for v in values)
    if len(value) != n:
        raise ValueError(f"{name} has {len(value)} entries but the layer has {n} axes; give one per axis or a scalar")
    return value


@register_notrace_module  # a leaf for torch.fx: the table depends on the grid's size
class PositionEncoding(nn.Module):
    """The position encoding of family ``family`` for tokens on a grid or at given positions.

    Args:
        dim: channels per head (the head dim).
        axes: coordinate axes: 1 (sequence), 2 (image rows, cols), 3 (video t, h, w), ...
        family: a registered family name (``vit_rope.families.FAMILIES``).
        num_heads, depth: heads of the attention, and model layers (families that learn per layer use it).
        num_prefix_tokens: leading tokens (cls, registers) that stay unrotated (and unbiased).
        coords: ``"index"`` (integer patch indices) or ``"normalized"`` (patch centres in [-1, 1] per axis, times 2π
            as in DINOv3, so coordinates do not depend on the resolution).
        scaling: the scaling (extrapolation) mode for grids other than ``ref_grid``, one of the family's
            ``scaling_modes``: ``"none"``, ``"pi"`` (coordinates / s), ``"normalized"`` (any grid mapped onto the
            extent of ``ref_grid``), and for fixed ladders ``"ntk"`` (``theta · s ** (d / (d - 2))`` per section of d
            channels) and ``"yarn"`` (a ramp between interpolated and kept frequencies, and the attention temperature).
        scale: s, a scalar or one per axis; ``None`` derives it per axis from the grid: ``s = max(n / n_ref, 1)``.
        ref_grid: the training grid (for derived scales, YaRN's original length, and ``"normalized"``).
        shift, jitter, rescale: DINOv3's training-only coordinate augmentation, drawn once per table (once a forward
            pass in the models): a shift from U[-shift, shift] per axis, a per-axis factor log-uniform in
            [1/jitter, jitter], one shared factor log-uniform in [1/rescale, rescale].
        **options: the family's own options (``theta``, ``layout``, ``axis_dims``, ``block_size``, ...).
    """

    def __init__(
        self,
        dim: int,
        axes: int = 2,
        family: str = "axial",
        *,
        num_heads: int | None = None,
        depth: int | None = None,
        num_prefix_tokens: int = 0,
        coords: str = "index",
        scaling: str = "none",
        scale: float | Sequence[float] | None = None,
        ref_grid: Sequence[int] | None = None,
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
        **options,
    ) -> None:
        super().__init__()
        if isinstance(axes, bool) or not isinstance(axes, int) or axes < 1:
            raise ValueError(f"axes={axes!r}: a position encoding needs a whole number of axes, at least one")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise ValueError(
                f"dim={dim!r}: the head dim must be an even whole number of at least 2 (rotations turn channel pairs)"
            )
        if coords not in ("index", "normalized"):
            raise ValueError(f"coords={coords!r}: choose 'index' or 'normalized'")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens={num_prefix_tokens} must be 0 or more")
        for name, v, low in (("shift", shift, 0.0), ("jitter", jitter, 1.0), ("rescale", rescale, 1.0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{name}={v!r} must be a number (None turns it off)")
            if v is not None and not (v >= low and math.isfinite(v)):
                raise ValueError(f"{name}={v} must be finite and at least {low} (None turns it off)")
        self.dim, self.axes, self.num_prefix_tokens, self.coords = dim, axes, num_prefix_tokens, coords
        self.ref_grid = None if ref_grid is None else tuple(int(n) for n in ref_grid)
        self.shift, self.jitter, self.rescale = shift, jitter, rescale
        options = {k: v for k, v in options.items() if v is not None}
        self.family = create_family(family, dim, axes, num_heads=num_heads, depth=depth, ref_grid=ref_grid, **options)
        self.set_scaling(scaling, scale)

    # ------------------------------------------------------------------------------------------------ config
    @property
    def scaling_modes(self) -> tuple[str, ...]:
        """The scaling (extrapolation) modes this family supports."""
        return self.family.scaling_modes

    @property
    def augment(self) -> bool:
        return self.training and any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def set_scaling(self, scaling: str = "none", scale: float | Sequence[float] | None = None) -> None:
        """Choose the scaling (extrapolation) mode, e.g. per evaluation resolution."""
        name = self.family.name
        if scaling not in self.scaling_modes:
            why = " (ntk and yarn rescale a fixed frequency ladder, which a learned family has none of)"
            raise ValueError(
                f"scaling={scaling!r} is not a mode of family {name!r}: use one of {self.scaling_modes}"
                + (why if scaling in ("ntk", "yarn") else "")
            )
        if scaling in ("yarn", "normalized") and self.ref_grid is None:
            raise ValueError(f"scaling={scaling!r} needs ref_grid (the training grid): it is measured against it")
        if scaling != "none" and scale is None and self.ref_grid is None:
            raise ValueError(f"scaling={scaling!r} needs a scale factor or ref_grid (the training grid) to derive one")
        scales = None if scale is None else _as_tuple(scale, self.axes, "scale")
        if scales is not None and not all(0 < s < math.inf for s in scales):
            raise ValueError(f"scale={scale} must be positive and finite")
        self.scaling, self.scale = scaling, scales

    def set_ref_grid(self, ref_grid: Sequence[int]) -> None:
        """Move the training grid (a model's ``set_input_size``)."""
        self.ref_grid = tuple(int(n) for n in ref_grid)

    def extra_repr(self) -> str:
        return f"prefix={self.num_prefix_tokens}, coords={self.coords}, scaling={self.scaling}"

    # ------------------------------------------------------------------------------------------------ tables
    def scaling_for(self, grid: Sequence[int] | None = None, grids: Tensor | None = None) -> Scaling:
        """The mode and per-axis scale factors for a grid, or for a batch of per-sample ``grids (B, axes)`` (where a
        mode that rescales the frequency ladder needs one scale for the batch); normalised coordinates never rescale:
        they do not grow."""
        if self.coords == "normalized":
            return Scaling(self.scaling, (1.0,) * self.axes, self.ref_grid)
        if grids is None:
            return Scaling(self.scaling, scale_factors(grid, self.ref_grid, self.scale, self.axes), self.ref_grid)
        if self.scaling not in ("ntk", "yarn"):  # per-sample scales act on the coordinates alone (coordinates())
            return Scaling(self.scaling, (1.0,) * self.axes, self.ref_grid)
        if self.scale is not None:
            return Scaling(self.scaling, self.scale, self.ref_grid)
        if torch.compiler.is_compiling():
            raise ValueError(
                f"scaling={self.scaling!r} of a native-resolution batch derives one scale for the batch from its "
                "grids, a value torch.compile cannot trace; give it (set_scaling(mode, scale), the model's rope_scale)"
            )
        scales = self.sample_scales(grids)  # (B, 1, axes)
        if self.scaling in ("ntk", "yarn") and bool((scales != scales[:1]).any()):
            raise ValueError(
                f"scaling={self.scaling!r} rescales the frequency ladder of the whole batch, but the samples' grids "
                "ask different scales; give one (set_scaling(mode, scale), the model's rope_scale) or use 'pi'"
            )
        return Scaling(self.scaling, tuple(scales[0, 0].tolist()), self.ref_grid)

    def sample_scales(self, grids: Tensor) -> Tensor:
        """Per-sample scale factors ``(B, 1, axes)`` for ``grids (B, axes)``: the given scale, else
        ``max(n / n_ref, 1)`` per axis (1 without a reference grid)."""
        grids = grids.unsqueeze(-2).to(torch.float64)
        if self.scale is not None:
            return grids.new_tensor(self.scale).expand_as(grids)
        if self.ref_grid is None:
            return torch.ones_like(grids)
        return (grids / grids.new_tensor(self.ref_grid)).clamp(min=1.0)

    def coordinates(
        self, grid: Sequence[int] | None, positions: Tensor | None, device, dtype, grids: Tensor | None = None
    ) -> Tensor:
        """Token coordinates ``([B,] N, axes)`` after the coordinate modes and augmentation (prefix tokens excluded);
        with ``grids (B, axes)`` the positions are patch indices on each sample's own grid, which the modes (and
        normalised coordinates) measure per sample."""
        if grid is not None:
            coords = grid_coordinates(grid, self.coords == "normalized", device, dtype)
        else:
            coords = positions.to(device=device, dtype=dtype)
        sizes = grid if grids is None else grids.to(device=device, dtype=dtype).unsqueeze(-2)  # (B, 1, axes)
        if grids is not None and self.coords == "normalized":
            coords = (coords + 0.5) / sizes * 2 - 1  # patch centres in [-1, 1] of each sample's grid
        if self.coords == "index":
            scales = self.scaling_for(grid).scales if grids is None else self.sample_scales(grids)
            coords = scaled_coordinates(coords, self.scaling, scales, sizes, self.ref_grid)
        if self.augment:
            coords = augment(coords, self.shift, self.jitter, self.rescale)  # in patches, or in [-1, 1] when normalised
        if (grid is not None or grids is not None) and self.coords == "normalized":
            coords = coords * (2 * math.pi)
        return coords

    def table(
        self,
        grid: Sequence[int] | None = None,
        positions: Tensor | None = None,
        *,
        grids: Tensor | None = None,
        valid: Tensor | None = None,
        tokens: Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Table:
        """The table of a grid (row-major tokens) or of explicit ``positions ([B,] N, axes)``, prefix tokens first.

        ``grids (B, axes)``: the positions are patch indices on each sample's own grid (a native-resolution batch),
        which scaling modes and normalised coordinates measure per sample. ``valid (B, N)``: which tokens are real;
        padding is left out of attention (the table's ``keys``) and placed at its sample's centroid, so that nothing
        measured over a sample's tokens moves. ``tokens (B, K)``: the tokens each sample kept after token dropping
        (they keep their positions). Built per call (a small fraction of a forward, docs/speed.md), computed in
        float64 and kept in float32, or float64 for ``dtype`` float64."""
        if (grid is None) == (positions is None):
            raise ValueError("pass exactly one of grid=(sizes per axis) or positions=(N, axes) coordinates")
        if grid is not None:
            grid = self._checked_grid(grid, grids, valid)
        else:
            self._check_positions(positions, grids, valid)
        device = torch.device(device) if device is not None else positions.device if grid is None else None
        device = device or torch.device("cpu")
        if valid is not None:  # padding at its sample's centroid: means, extents and centres stay the valid tokens'
            w = valid.to(positions.dtype).unsqueeze(-1)
            centroid = (positions * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True)
            positions = torch.where(valid.unsqueeze(-1), positions, centroid)
        table = self._build(grid, positions, device, torch.float64 if dtype == torch.float64 else torch.float32, grids)
        table = replace(table, fused=fused(device, dtype))  # attention's path for inputs of this device and dtype
        p = self.num_prefix_tokens
        if valid is not None:
            keys = torch.cat((valid.new_ones(valid.shape[0], p), valid), dim=1).to(device)  # (B, prefix + N)
            table = replace(table, keys=keys[:, None, None, :])  # SDPA's key-only mask
        if tokens is None:
            return table
        prefix = torch.arange(p, device=tokens.device).expand(tokens.shape[0], p)
        return table.gather(torch.cat((prefix, tokens + p), dim=1))  # each sample's rows, prefix rows first

    forward = table  # a model asks its encoding for a table by calling it (torch.fx sees the call as one leaf)

    def _checked_grid(self, grid: Sequence[int], grids: Tensor | None, valid: Tensor | None) -> tuple[int, ...]:
        """``grid`` as a tuple of whole numbers of tokens, one per axis, each at least 1."""
        try:  # whole numbers (ints, numpy's, a traced size), not a float that int() would cut
            if any(isinstance(n, bool) for n in grid):
                raise TypeError
            grid = tuple(operator.index(n) for n in grid)
        except TypeError:
            raise ValueError(f"grid={tuple(grid)}: sizes per axis are whole numbers of tokens") from None
        if len(grid) != self.axes:
            raise ValueError(f"grid={grid} has {len(grid)} sizes but the layer has axes={self.axes}; give one each")
        if min(grid) < 1:
            raise ValueError(f"grid={grid}: every axis needs at least one position")
        if grids is not None or valid is not None:
            raise ValueError("grids and valid describe explicit per-sample positions: pass positions with them")
        return grid

    def _check_positions(self, positions: Tensor, grids: Tensor | None, valid: Tensor | None) -> None:
        """Given positions: a float tensor ``([B,] N, axes)``, and what comes with them per sample."""
        if not isinstance(positions, Tensor):
            raise ValueError(f"positions is a {type(positions).__name__}; pass a float tensor (N, {self.axes}) or "
                             f"(B, N, {self.axes}), e.g. torch.tensor(positions, dtype=torch.float32)")  # fmt: skip
        if positions.ndim not in (2, 3) or positions.shape[-1] != self.axes or not positions.is_floating_point():
            raise ValueError(
                f"positions has shape {tuple(positions.shape)} and dtype {positions.dtype}; expected float (N, "
                f"{self.axes}) or (B, N, {self.axes}): one coordinate per axis, in grid axis order"
            )
        self._check_samples(positions, grids, valid)

    def _check_samples(self, positions: Tensor, grids: Tensor | None, valid: Tensor | None) -> None:
        B, N = positions.shape[0], positions.shape[-2]
        # a caller's positions must be finite (a NaN would turn every channel into NaN); a NaFlex batch's (grids)
        # are integer indices read_batch checked; compiled, the values are data torch.compile cannot branch on
        if grids is None and not torch.compiler.is_compiling() and not bool(torch.isfinite(positions).all()):
            raise ValueError("positions hold NaN or inf: every coordinate must be a finite number")
        if grids is not None and (positions.ndim != 3 or tuple(grids.shape) != (B, self.axes)):
            raise ValueError(
                f"grids has shape {tuple(grids.shape)}; with positions {tuple(positions.shape)} it must be "
                f"(B, {self.axes}): each sample's grid, one size per axis"
            )
        if valid is not None and (positions.ndim != 3 or tuple(valid.shape) != (B, N) or valid.dtype != torch.bool):
            raise ValueError(
                f"valid has shape {tuple(valid.shape)} and dtype {valid.dtype}; with positions "
                f"{tuple(positions.shape)} it must be bool (B, N): True for each real token"
            )
        for name, t in (("grids", grids), ("valid", valid)):
            if t is not None and t.device != positions.device:
                raise ValueError(f"{name} is on {t.device} but positions are on {positions.device}; pass them on one "
                                 "device")  # fmt: skip
        if torch.compiler.is_compiling():  # (values are data torch.compile cannot branch on: eager checks them)
            return
        if valid is not None and not bool(valid.any(-1).all()):
            raise ValueError("valid marks no token of some sample as real: every sample needs at least one")
        if grids is not None:  # patch indices on each sample's own grid: from 0 to its size - 1 along each axis
            real = positions if valid is None else positions.masked_fill(~valid.unsqueeze(-1), 0)
            outside = (real < 0) | (real > grids.unsqueeze(1).to(real.dtype) - 1)
            if bool(outside.any()):
                b, n, a = (int(i) for i in outside.nonzero()[0])
                raise ValueError(
                    f"token {n} of sample {b} is at index {real[b, n, a].item():g} on axis {a}, outside its grid of "
                    f"{int(grids[b, a])} (indices 0 to {int(grids[b, a]) - 1}); give each sample's grid in grids"
                )

    def _build(self, grid, positions, device: torch.device, dtype: torch.dtype, grids: Tensor | None = None) -> Table:
        calc = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        scaling = self.scaling_for(grid, grids)
        family, p = self.family, self.num_prefix_tokens
        build = Build(p, dtype, family.rotating_pairs(), family.temperature(scaling))
        with outside_autocast(device.type):
            coords = self.coordinates(grid, positions, device, calc, grids)  # ([B,] N, axes)
            if p > 0 and family.prefix_at_centre:  # prefix tokens where the family places them: the tokens' centre
                centre = coords.mean(dim=-2, keepdim=True).expand(*coords.shape[:-2], p, -1)
                coords, build = torch.cat((centre, coords), dim=-2), replace(build, prefix=0)
            return family.encode(coords, scaling, build)


class RotaryEmbedding(PositionEncoding):
    """n-dimensional rotary position embedding of any rotary family (``family``: its name in ``vit_rope.FAMILIES``):
    calling it rotates a tensor by its tokens' positions.

    Axial RoPE's ``theta`` defaults to 100 (best for ViTs in Heo et al.), RoPE-Mixed's to 10 (their init); 10000 is
    the language-model value. ``layout="interleaved"`` pairs channels (2i, 2i+1), ``"half"`` pairs i with i + dim/2.
    ``axis_dims``: channels per axis, in grid axis order (e.g. ``(16, 24, 24)`` for (t, h, w)); default equal even
    sections, the remainder unrotated (64 over 3 axes → 20/20/20 + 4); ``rotate_fraction`` leaves more unrotated. The
    other arguments are :class:`PositionEncoding`'s.
    """

    def __init__(
        self,
        dim: int,
        axes: int = 2,
        theta: float | None = None,
        layout: str | None = None,
        axis_dims: Sequence[int] | None = None,
        rotate_fraction: float | None = None,
        family: str = "axial",
        **kwargs,
    ) -> None:
        if family not in FAMILIES or not FAMILIES[family].rotary:
            rotary = sorted(n for n, f in FAMILIES.items() if f.rotary)
            bias = " is an attention bias, not a rotation (PositionEncoding builds it)" if family in FAMILIES else ""
            raise ValueError(f"family={family!r}{bias}: choose one of {rotary}")
        options = dict(theta=theta, layout=layout, axis_dims=axis_dims, rotate_fraction=rotate_fraction)
        super().__init__(dim, axes, family, **options, **kwargs)

    def forward(
        self,
        x: Tensor,
        grid: Sequence[int] | None = None,
        positions: Tensor | None = None,
        *,
        inverse: bool = False,
        layer: int | None = None,
    ) -> Tensor:
        """Rotate ``x (..., N, dim)`` by the positions of its tokens (``inverse=True``: rotate back). Per-head
        families need x as ``(..., heads, N, dim)``; per-layer ones ``layer``."""
        if not isinstance(x, Tensor) or x.ndim < 2:
            got = f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"a {type(x).__name__}"
            raise ValueError(f"x is {got}; pass a tensor (..., N, dim): N tokens of dim channels each")
        if not x.is_floating_point():
            raise ValueError(f"x has dtype {x.dtype}; rotations turn float tensors: convert it, e.g. x.float()")
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has last dim {x.shape[-1]} but the layer was built with dim={self.dim}; the last dim of x must be "
                "the head dim the layer rotates"
            )
        if isinstance(positions, Tensor) and positions.device != x.device:
            raise ValueError(f"positions are on {positions.device} but x is on {x.device}; pass them on one device")
        samples = isinstance(positions, Tensor) and positions.ndim == 3  # (B, N, axes): each sample its own
        if samples and (x.ndim not in (3, 4) or x.shape[0] != positions.shape[0]):
            raise ValueError(
                f"positions {tuple(positions.shape)} give each of {positions.shape[0]} samples its own positions; "
                f"x must be (B, N, dim) or (B, heads, N, dim) with B = {positions.shape[0]}, got {tuple(x.shape)}"
            )
        if samples and x.ndim == 3:  # (B, N, dim): the table's head dim goes in and out again
            return self.forward(x.unsqueeze(1), positions=positions, inverse=inverse, layer=layer).squeeze(1)
        table: RotaryTable = self.table(grid, positions, device=x.device, dtype=x.dtype)
        if x.shape[-2] != table.num_tokens:
            prefix = f" + {self.num_prefix_tokens} prefix" if self.num_prefix_tokens else ""
            raise ValueError(
                f"x has {x.shape[-2]} tokens but the table has {table.num_tokens - self.num_prefix_tokens}{prefix}; "
                "tokens must be the flattened (row-major) grid, or one per position"
            )
        if table.per_layer and layer is None:
            raise ValueError("this family learns an encoding per model layer (depth is set): pass layer=index")
        depth = self.family.depth
        if table.per_layer and (isinstance(layer, bool) or not isinstance(layer, int) or not -depth <= layer < depth):
            raise ValueError(f"layer={layer!r}: this encoding learns {depth} layers; pass an index, 0 to {depth - 1}")
        table = table.layer(layer) if table.per_layer else table
        if table.num_heads > 1 and (x.ndim < 3 or x.shape[-3] != table.num_heads):
            raise ValueError(
                f"family {self.family.name!r} encodes per head: x must be (..., heads={table.num_heads}, N, dim), "
                f"got {tuple(x.shape)}"
            )
        return table.rotate(x, inverse)
