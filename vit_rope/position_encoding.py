"""Position encodings over any number of axes: coordinates → a family → what each head's attention applies.

:class:`PositionEncoding` is the pipeline every family shares: the tokens' coordinates (from a grid, row-major, or
given per token), the coordinate-level extrapolation modes and augmentation (:mod:`vit_rope.coords`), the family
(:mod:`vit_rope.families`, by its registry name), identity rows for prefix tokens (cls, registers), and a cache of
tables per grid. :class:`RotaryEmbedding` is the same for the rotary families, with ``freqs=NAME`` naming the family.

Fixed tables are computed in float64 and kept in float32 (float64 for float64 inputs), also under autocast; learned
ones in float32 at least. Tables are never stored in checkpoints, so a model loads at any resolution.
"""

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .coords import augment, grid_coordinates, scale_factors, scaled_coordinates
from .families import FAMILIES, Extrapolation, create_family
from .families.base import PairFamily
from .tables import Table, apply_rotary, outside_autocast, tracing

__all__ = ["SCALING_MODES", "PositionEncoding", "RotaryEmbedding", "unscripted"]

SCALING_MODES: tuple[str, ...] = ("none", "pi", "ntk", "yarn", "normalized")  # every mode some family supports
_CACHE_SIZE = 16

# TorchScript compiles a model's trunk but not its families (any Python): the scripted model hands its encoding's
# scripted copy to Python (torch.jit.ignore), and unscripted() finds the module it was made from here, where
# __prepare_scriptable__ (TorchScript's hook, called on every module about to be scripted) puts it: a scripted module
# keeps no Python object. Only scripted encodings are kept (as long as the process runs).
_SCRIPTED: dict[int, "PositionEncoding"] = {}
_KEYS = itertools.count()


def _as_tuple(value: float | Sequence[float], n: int, name: str) -> tuple[float, ...]:
    values = (value,) * n if isinstance(value, int | float | str) else tuple(value)
    if any(isinstance(v, bool | str) or not isinstance(v, int | float) for v in values):
        raise ValueError(f"{name}={value!r} must be a number or one number per axis")
    value = tuple(float(v) for v in values)
    if len(value) != n:
        raise ValueError(f"{name} has {len(value)} entries but the layer has {n} axes; give one per axis or a scalar")
    return value


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
        scaling: extrapolation mode for grids other than ``ref_grid``, one of the family's ``scaling_modes``:
            ``"none"``, ``"pi"`` (coordinates / s), ``"normalized"`` (any grid mapped onto the extent of ``ref_grid``),
            and for fixed ladders ``"ntk"`` (``theta · s ** (d / (d - 2))`` per section of d channels) and
            ``"yarn"`` (a ramp between interpolated and kept frequencies, and the attention temperature).
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
        if axes < 1:
            raise ValueError(f"axes={axes}: a position encoding needs at least one axis")
        if dim < 2 or dim % 2:
            raise ValueError(f"dim={dim} is odd; rotary embeddings turn channel pairs, so dim must be even")
        if coords not in ("index", "normalized"):
            raise ValueError(f"coords={coords!r}: choose 'index' or 'normalized'")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens={num_prefix_tokens} must be 0 or more")
        for name, v, low in (("shift", shift, 0.0), ("jitter", jitter, 1.0), ("rescale", rescale, 1.0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{name}={v!r} must be a number (None turns it off)")
            if v is not None and not v >= low:
                raise ValueError(f"{name}={v} must be at least {low} (None turns it off)")
        self.dim, self.axes, self.num_prefix_tokens, self.coords = dim, axes, num_prefix_tokens, coords
        self.ref_grid = None if ref_grid is None else tuple(int(n) for n in ref_grid)
        self.shift, self.jitter, self.rescale = shift, jitter, rescale
        options = {k: v for k, v in options.items() if v is not None}
        self.family = create_family(family, dim, axes, num_heads=num_heads, depth=depth, ref_grid=ref_grid, **options)
        self._cache: OrderedDict[tuple, tuple[tuple, Table]] = OrderedDict()  # key -> (parameter versions, table)
        self.set_scaling(scaling, scale)

    __jit_unused_properties__ = ["scaling_modes", "augment"]  # Python: a scripted model asks them through unscripted()

    def __prepare_scriptable__(self) -> "PositionEncoding":
        self.script_key = next(_KEYS)
        _SCRIPTED[self.script_key] = self
        return self

    # ------------------------------------------------------------------------------------------------ config
    @property
    def scaling_modes(self) -> tuple[str, ...]:
        """The extrapolation modes this family supports."""
        return self.family.scaling_modes

    @property
    def augment(self) -> bool:
        return self.training and any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def set_scaling(self, scaling: str = "none", scale: float | Sequence[float] | None = None) -> None:
        """Choose the extrapolation mode (e.g. per evaluation resolution); clears the table cache."""
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
        self.scaling = scaling
        self.scale = None if scale is None else _as_tuple(scale, self.axes, "scale")
        if self.scale is not None and not min(self.scale) > 0:
            raise ValueError(f"scale={scale} must be positive")
        self.clear_cache()

    def set_ref_grid(self, ref_grid: Sequence[int]) -> None:
        """Move the training grid (a model's ``set_input_size``); clears the table cache."""
        self.ref_grid = tuple(int(n) for n in ref_grid)
        self.clear_cache()

    def clear_cache(self) -> None:
        self._cache = OrderedDict()

    def extra_repr(self) -> str:
        return f"prefix={self.num_prefix_tokens}, coords={self.coords}, scaling={self.scaling}"

    # ------------------------------------------------------------------------------------------------ tables
    def extrapolation(self, grid: Sequence[int] | None = None) -> Extrapolation:
        """The mode and per-axis scale factors for a grid (normalised coordinates never rescale: they do not grow)."""
        scales = (
            (1.0,) * self.axes
            if self.coords == "normalized"
            else scale_factors(grid, self.ref_grid, self.scale, self.axes)
        )
        return Extrapolation(self.scaling, scales, self.ref_grid)

    def coordinates(self, grid: Sequence[int] | None, positions: Tensor | None, device, dtype) -> Tensor:
        """Token coordinates ``([B,] N, axes)`` after the coordinate modes and augmentation (prefix tokens excluded)."""
        ext = self.extrapolation(grid)
        if grid is not None:
            coords = grid_coordinates(grid, self.coords == "normalized", device, dtype)
        else:
            coords = positions.to(device=device, dtype=dtype)
        if self.coords == "index":
            coords = scaled_coordinates(coords, ext.mode, ext.scales, grid, self.ref_grid)
        if self.augment:
            coords = augment(coords, self.shift, self.jitter, self.rescale)  # in patches, or in [-1, 1] when normalised
        if grid is not None and self.coords == "normalized":
            coords = coords * (2 * math.pi)
        return coords

    def table(
        self,
        grid: Sequence[int] | None = None,
        positions: Tensor | None = None,
        *,
        keep: Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Table:
        """The encoding of a grid (row-major tokens) or of explicit ``positions`` ``([B,] N, axes)``, prefix tokens
        first; ``keep (B, K)`` picks each sample's grid tokens that token dropping kept (they keep their positions).
        ``dtype`` float64 keeps float64 precision; anything else gives float32."""
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        if (grid is None) == (positions is None):
            raise ValueError("pass exactly one of grid=(sizes per axis) or positions=(N, axes) coordinates")
        if grid is not None:
            grid = tuple(int(n) for n in grid)
            if len(grid) != self.axes:
                raise ValueError(f"grid={grid} has {len(grid)} sizes but the layer has axes={self.axes}; give one each")
            if min(grid) < 1:
                raise ValueError(f"grid={grid}: every axis needs at least one position")
        elif positions.ndim not in (2, 3) or positions.shape[-1] != self.axes:
            raise ValueError(
                f"positions has shape {tuple(positions.shape)}; expected (N, {self.axes}) or (B, N, {self.axes}): one "
                "coordinate per axis, in grid axis order"
            )
        device = (
            torch.device(device)
            if device is not None
            else (positions.device if positions is not None else torch.device("cpu"))
        )
        if keep is not None:  # the grid's table (cached where it may be), each sample's rows of it
            if grid is None:
                raise ValueError("keep picks tokens of a grid: pass grid with it (explicit positions need no keep)")
            p = self.num_prefix_tokens
            prefix = torch.arange(p, device=keep.device).expand(keep.shape[0], p)
            return self.table(grid, device=device, dtype=dtype).gather(torch.cat((prefix, keep + p), dim=1))
        key = self._cache_key(grid, device, dtype)
        versions = tuple((id(p), p._version) for p in self.family.parameters())
        if key is not None and key in self._cache and self._cache[key][0] == versions:
            self._cache.move_to_end(key)
            return self._cache[key][1]
        table = self._build(grid, positions, device, dtype)
        if key is not None:  # one entry a grid: a learned family's newer parameters replace it
            self._cache[key] = (versions, table)
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return table

    def _cache_key(self, grid, device, dtype) -> tuple | None:
        """Where a table may be kept: a grid, no augmentation, no tracing, and for a learned family no gradient (its
        entry remembers the parameters' versions and is rebuilt when they move; the cache is also cleared when the
        module switches between training and evaluation, and after a load, since a fused optimizer step or a load into
        frozen parameters need not move a version)."""
        learned = any(p.requires_grad for p in self.family.parameters())
        if grid is None or self.augment or tracing() or (learned and torch.is_grad_enabled()):
            return None
        # inference tensors cannot be saved for backward later: inference mode keeps its tables apart
        return (grid, device, dtype, torch.is_inference_mode_enabled())

    def train(self, mode: bool = True) -> "PositionEncoding":
        self.clear_cache()
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.clear_cache()
        super()._load_from_state_dict(*args, **kwargs)

    def _build(self, grid, positions, device, dtype) -> Table:
        calc = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        ext = self.extrapolation(grid)
        with outside_autocast(device.type):
            table = self._encode(self.coordinates(grid, positions, device, calc), ext)
            temperature = self.family.temperature(ext)
            if temperature is not None:  # after the prefix rows: it scales every q·k logit, the cls token's too
                table = table.with_temperature(temperature)
        built = next(t for t in table.tensors() if t is not None).dtype
        return table.to(dtype) if built != dtype else table

    def _encode(self, coords: Tensor, ext: Extrapolation) -> Table:
        """The family's table (p-RoPE's unturned pairs applied), with the prefix tokens' rows first: unturned (and
        unbiased), or where the family places them (``prefix_at_centre``: the tokens' centre, as ComRoPE's cls
        token)."""
        p, family = self.num_prefix_tokens, self.family
        centre = p > 0 and family.prefix_at_centre
        if centre:
            coords = torch.cat((coords.mean(dim=-2, keepdim=True).expand(*coords.shape[:-2], p, -1), coords), dim=-2)
        table = family.encode(coords, ext)
        if isinstance(family, PairFamily):  # p-RoPE: the pairs that do not turn, set to the identity
            table = family.keep_rotating(table)
        return table.with_prefix(p) if p and not centre else table

    def has_temperature(self, grid: Sequence[int] | None = None) -> bool:
        """Whether tables for ``grid`` scale as they turn (YaRN's attention temperature): they then suit q and k (the
        temperature of their logits) but not v or an output turned back."""
        return self.family.temperature(self.extrapolation(grid)) is not None

    # ---------------------------------------------------------------------------------------------- forward
    @torch.jit.ignore  # the layer's own API, Python (a scripted model asks table() through its own callback)
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
        if not self.family.rotary:
            raise ValueError(f"family {self.family.name!r} is an attention bias, not a rotation: attention applies it")
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has last dim {x.shape[-1]} but the layer was built with dim={self.dim}; the last dim of x must be "
                "the head dim the layer rotates"
            )
        if grid is not None and len(grid) == self.axes and x.shape[-2] != self.num_prefix_tokens + math.prod(grid):
            prefix = f" + {self.num_prefix_tokens} prefix" if self.num_prefix_tokens else ""
            raise ValueError(
                f"x has {x.shape[-2]} tokens but grid={tuple(grid)} has {math.prod(grid)}{prefix}; tokens must be the "
                "flattened (row-major) grid"
            )
        table = self.table(grid, positions, device=x.device, dtype=x.dtype)
        if table.per_layer and layer is None:
            raise ValueError("this family learns an encoding per model layer (depth is set): pass layer=index")
        table = table.layer(layer) if table.per_layer else table
        if table.num_heads > 1 and (x.ndim < 3 or x.shape[-3] != table.num_heads):
            raise ValueError(
                f"family {self.family.name!r} encodes per head: x must be (..., heads={table.num_heads}, N, dim), "
                f"got {tuple(x.shape)}"
            )
        return apply_rotary(x, table, inverse=inverse)


class RotaryEmbedding(PositionEncoding):
    """n-dimensional rotary position embedding of any rotary family (``freqs``: its name in ``vit_rope.FAMILIES``).

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
        freqs: str = "axial",
        **kwargs,
    ) -> None:
        if freqs in FAMILIES and not FAMILIES[freqs].rotary:
            raise ValueError(f"freqs={freqs!r} is an attention bias, not a rotation: use PositionEncoding")
        if freqs not in FAMILIES:
            rotary = sorted(n for n, f in FAMILIES.items() if f.rotary)
            raise ValueError(f"freqs={freqs!r}: choose one of {rotary}")
        options = dict(theta=theta, layout=layout, axis_dims=axis_dims, rotate_fraction=rotate_fraction)
        super().__init__(dim, axes, freqs, **options, **kwargs)


def unscripted(encoding: nn.Module) -> PositionEncoding:
    """The Python module of a position encoding: itself, or for the scripted copy a scripted model hands over, the
    module it was scripted from (following the copy's train/eval mode)."""
    if isinstance(encoding, PositionEncoding):
        return encoding
    module = _SCRIPTED[encoding.script_key]
    if module.training != encoding.training:
        module.train(encoding.training)
    return module
