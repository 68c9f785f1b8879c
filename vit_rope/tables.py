"""What a position-encoding family hands attention for one set of tokens, and the whole math of applying it.

* :class:`RotaryTable`: a rotation of each token's channels, per head: channel pairs turned by angles (``cos``,
  ``sin``: axial, mixed, spiral RoPE), or consecutive blocks of ``b`` channels turned by ``b×b`` rotation matrices
  (``blocks``: ComRoPE, LieRE); either optionally inside an orthogonal change of basis (``basis``: Cayley-STRING's
  ``R = Pᵀ · turn · P``).
* :class:`AttentionBias`: an additive bias on the attention logits (LookHere).
* :class:`ParabolicBias`: a bias on the logits that is an inner product of a few columns appended to q and k (PaPE),
  so attention stays one SDPA call with no ``N × N`` bias at all.

Leading dims broadcast against attention's ``(B, heads, N, dim)``: ``([B,] [layer,] [heads,] N, ...)``, where per-sample
tables (token dropping) and per-layer ones always carry a head dim (1 when heads share it); a table whose
``per_layer`` is set holds one entry per model layer (``.layer(i)`` picks one). Tables keep their own precision
(float32 at least): arithmetic runs in it, outside autocast, and the result is rounded once to the input's dtype.

Plain classes with typed fields rather than dataclasses: TorchScript compiles them, so a scripted model turns its q
and k here too.
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "AttentionBias",
    "ParabolicBias",
    "RotaryTable",
    "Table",
    "apply_rotary",
    "outside_autocast",
    "rotate_pairs",
    "tracing",
]


def tracing() -> bool:
    """True while torch.compile, torch.export, ONNX export or TorchScript tracing sees the code."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def outside_autocast(device_type: str):
    """A context where ops keep their inputs' precision, under autocast too (a device without autocast, such as meta,
    needs none)."""
    return torch.autocast(device_type, enabled=False) if torch.amp.is_autocast_available(device_type) else nullcontext()


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """Turn channel pairs of ``x (..., N, dim)`` by angles given as ``cos, sin (..., N, dim // 2)``, in their dtype.

    ``layout="interleaved"`` pairs channels (2i, 2i+1), ``"half"`` pairs i with i + dim/2. Real arithmetic only (no
    complex ops, no ``tensor_split``), so it traces, exports to ONNX, scripts and fuses under ``torch.compile``.
    """
    x = x.to(torch.promote_types(x.dtype, cos.dtype))
    if layout == "interleaved":
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., N, dim/2) each
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


def _complex_viewable(x: Tensor) -> bool:
    """Whether a complex view can take the channel pairs of ``x`` (q or k of a fresh qkv projection can)."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def _turn_complex(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Channel pairs (2i, 2i+1) of ``x`` times ``cos + i·sin`` as complex numbers: one pass over x where
    :func:`rotate_pairs` takes five (the eager fast path: 1.07x the forward and 1.05x the train-step throughput of
    ViT-S at 224², batch 8, 2 CPU cores; ``bench/throughput.py --sections apply``)."""
    real = torch.promote_types(x.dtype, cos.dtype)
    z = torch.view_as_complex(x.to(real).unflatten(-1, (-1, 2)))
    return torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2)


def _take(t: Tensor | None, rows: Tensor, dim: int) -> Tensor | None:
    """Rows ``(B, T)`` of token dim ``dim`` (from the end) of ``t``, the sample dim first and a head dim kept:
    ``([layer,] heads | 1, N, ...)`` → ``(B, [layer,] heads | 1, T, ...)``."""
    if t is None:
        return None
    if t.dim() == -dim:  # no head dim: one for every head
        t = t.unsqueeze(0)
    at = t.dim() + dim
    picked = t.index_select(at, rows.reshape(-1).to(t.device)).unflatten(at, rows.shape)
    return picked.movedim(at, 0)


def _prepend(t: Tensor, n: int, value: float, dim: int) -> Tensor:
    """``t`` with ``n`` entries of ``value`` first along dim ``dim`` (counted from the end): the rows of prefix
    tokens."""
    shape = list(t.shape)
    shape[t.dim() + dim] = n
    return torch.cat((t.new_full(shape, value), t), dim=dim)


class RotaryTable:
    """A rotation of every token's channels, per head: pairs by ``cos``/``sin ([B,] [layer,] heads | 1, N, dim // 2)``
    in ``layout``, or blocks by ``blocks ([B,] [layer,] heads | 1, N, dim // b, b, b)`` (channels past the last block
    stay unturned); inside ``basis ([layer,] heads | 1, dim, dim)`` when given: ``R = basisᵀ · turn · basis``.

    ``scaled``: ``|cos + i·sin| ≠ 1`` (YaRN's temperature), so it scales as it turns and cannot turn back.
    """

    def __init__(
        self,
        cos: Tensor | None = None,
        sin: Tensor | None = None,
        blocks: Tensor | None = None,
        basis: Tensor | None = None,
        layout: str = "interleaved",
        per_layer: bool = False,
        scaled: bool = False,
    ) -> None:
        self.cos = cos
        self.sin = sin
        self.blocks = blocks
        self.basis = basis
        self.layout = layout
        self.per_layer = per_layer
        self.scaled = scaled

    def _main(self) -> Tensor:
        """The tensor that says the shape: cos for pairs, blocks for blocks."""
        t = self.cos if self.blocks is None else self.blocks
        assert t is not None, "a RotaryTable needs cos and sin, or blocks"
        return t

    @property
    def num_tokens(self) -> int:
        t = self._main()
        return t.shape[-2] if self.blocks is None else t.shape[-4]

    @property
    def num_heads(self) -> int:
        """Heads the table holds one rotation each for (1: the same for all)."""
        t = self._main()
        head_dim = -3 if self.blocks is None else -5
        return t.shape[head_dim] if t.dim() >= -head_dim else 1

    # ------------------------------------------------------------------------------------------------ rotate
    def rotate(self, x: Tensor, inverse: bool = False) -> Tensor:
        """``x (..., N, dim)`` turned by each token's rotation (``inverse``: turned back, ``Rᵀ``); x's dtype."""
        if inverse and self.scaled:
            raise ValueError(
                "inverse=True under scaling='yarn' at a scale above 1: its table scales by the attention temperature "
                "as it turns, so turning back would scale again instead of undoing; use 'pi', 'ntk' or 'normalized'"
            )
        if self.basis is None and self.blocks is None:  # elementwise ops, which autocast leaves alone
            return self._turn_pairs(x, inverse).to(x.dtype)
        if torch.jit.is_scripting():
            return self._turn_in_basis(x, inverse).to(x.dtype)
        with outside_autocast(x.device.type):  # matrix products in the table's precision, under autocast too
            return self._turn_in_basis(x, inverse).to(x.dtype)

    def _turn_in_basis(self, x: Tensor, inverse: bool) -> Tensor:
        basis = self.basis
        if basis is not None:
            x = x.to(basis.dtype) @ basis.mT  # P x, x as rows
        x = self._turn_pairs(x, inverse) if self.blocks is None else self._turn_blocks(x, inverse)
        return x if basis is None else x @ basis  # Pᵀ · turn · P x

    def _turn_pairs(self, x: Tensor, inverse: bool) -> Tensor:
        cos, sin = self.cos, self.sin
        assert cos is not None and sin is not None
        sin = -sin if inverse else sin
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips this block only when the test stands alone)
            if self.layout == "interleaved" and not tracing() and _complex_viewable(x):
                return _turn_complex(x, cos, sin)
        return rotate_pairs(x, cos, sin, self.layout)

    def _turn_blocks(self, x: Tensor, inverse: bool) -> Tensor:
        R = self.blocks
        assert R is not None
        R = R.mT if inverse else R  # (..., N, blocks, b, b)
        count, b = R.shape[-3], R.shape[-1]
        turned = x[..., : count * b].to(R.dtype).unflatten(-1, (count, b))  # (..., N, blocks, b)
        batch = turned.dim() - R.dim() + 1  # leading dims of x that the table is the same for
        if batch > 0:
            # those dims as the columns of one matrix a block: one (b, b) @ (b, batch) product a block instead of
            # batch matrix-vector products (2.6x faster for ViT-S q at 224², batch 8, on 2 CPU cores)
            lead = turned.shape[:batch]
            columns = turned.flatten(0, batch - 1).movedim(0, -1)  # (..., N, blocks, b, batch)
            turned = (R @ columns).movedim(-1, 0).unflatten(0, lead)
        else:
            turned = (R @ turned.unsqueeze(-1)).squeeze(-1)
        turned = turned.flatten(-2)  # (..., N, blocks · b), broadcast against the table's leading dims
        rest = x[..., count * b :].to(turned.dtype)
        return torch.cat((turned, rest.expand(turned.shape[:-1] + rest.shape[-1:])), dim=-1)

    # ---------------------------------------------------------------------------------------------- derived
    def layer(self, index: int) -> "RotaryTable":
        """The table of model layer ``index`` (a table that is the same for every layer is returned as it is)."""
        if not self.per_layer:
            return self
        cos, sin, blocks, basis = self.cos, self.sin, self.blocks, self.basis
        return RotaryTable(
            None if cos is None else cos.select(-4, index),
            None if sin is None else sin.select(-4, index),
            None if blocks is None else blocks.select(-6, index),
            None if basis is None else basis.select(-4, index),
            self.layout,
            False,
            self.scaled,
        )

    def without_basis(self) -> "RotaryTable":
        """The turn alone (attention folds the basis into its q and k projections)."""
        return RotaryTable(self.cos, self.sin, self.blocks, None, self.layout, self.per_layer, self.scaled)

    @torch.jit.unused
    def gather(self, rows: Tensor) -> "RotaryTable":
        """Each sample's tokens ``rows (B, T)`` (prefix rows included): a per-sample table ``(B, [layer,] heads | 1,
        T, ...)``."""
        cos, sin = _take(self.cos, rows, -2), _take(self.sin, rows, -2)
        return self.replace(cos=cos, sin=sin, blocks=_take(self.blocks, rows, -4))

    @torch.jit.unused
    def with_prefix(self, n: int) -> "RotaryTable":
        """``n`` identity rows first: prefix tokens (cls, registers) stay unturned (``Pᵀ P = I`` with a basis)."""
        if self.blocks is not None:
            eye = torch.eye(self.blocks.shape[-1], dtype=self.blocks.dtype, device=self.blocks.device)
            shape = list(self.blocks.shape)
            shape[-4] = n
            return self.replace(blocks=torch.cat((eye.expand(shape), self.blocks), dim=-4))
        return self.replace(cos=_prepend(self.cos, n, 1.0, -2), sin=_prepend(self.sin, n, 0.0, -2))

    @torch.jit.unused
    def with_temperature(self, m: Tensor) -> "RotaryTable":
        """Every pair scaled by ``m (dim // 2,)`` as it turns (YaRN's attention temperature, prefix rows included)."""
        m = m.to(self.cos)
        return self.replace(cos=self.cos * m, sin=self.sin * m, scaled=True)

    @torch.jit.unused
    def to(self, dtype: torch.dtype) -> "RotaryTable":
        return self.with_tensors(*(None if t is None else t.to(dtype) for t in self.tensors()))

    @torch.jit.unused
    def tensors(self) -> tuple:
        """The table's tensors (gradient checkpointing passes them as arguments, so that their graph is kept)."""
        return self.cos, self.sin, self.blocks, self.basis

    @torch.jit.unused
    def with_tensors(self, cos, sin, blocks, basis) -> "RotaryTable":
        return self.replace(cos=cos, sin=sin, blocks=blocks, basis=basis)

    @torch.jit.unused
    def replace(self, **changes) -> "RotaryTable":
        """A copy with some fields changed."""
        return RotaryTable(**{**vars(self), **changes})


class AttentionBias:
    """A bias on the attention logits of distance penalties and fields of view (LookHere): query i, key j and head h
    get ``-slopes[h] · ‖xy_j - xy_i‖``, and ``-inf`` where a directed head's wedge (between its two rays, both
    included) does not hold the offset; prefix tokens (the first ``num_prefix``) see and are seen by every token,
    unpenalised. ``xy ([B,] N, 2)`` in (x right, y up); ``rays (heads, 2, 2)``: each head's start and end ray,
    ``directed (heads,)``: which heads have a field of view; ``layer_scale (layers,)``: a per-layer factor.

    Attention takes the bias a block of queries at a time (:meth:`block`; as many queries as keep a block's logits
    within ``block_bytes``, 4 MiB), so no ``N × N`` tensor need be held for a whole layer; ``dense``, the unscaled
    ``([B,] heads, N, N)`` bias precomputed once per grid, serves small grids.
    """

    def __init__(
        self,
        xy: Tensor,
        slopes: Tensor,
        rays: Tensor,
        directed: Tensor,
        num_prefix: int = 0,
        dense: Tensor | None = None,
        per_layer: bool = False,
        layer_scale: Tensor | None = None,
        block_bytes: int = 1 << 22,
    ) -> None:
        self.xy = xy
        self.slopes = slopes
        self.rays = rays
        self.directed = directed
        self.num_prefix = num_prefix
        self.dense = dense
        self.per_layer = per_layer
        self.layer_scale = layer_scale
        self.block_bytes = block_bytes

    @property
    def num_tokens(self) -> int:
        return self.xy.shape[-2]

    @property
    def num_heads(self) -> int:
        return self.slopes.shape[0]

    def layer(self, index: int) -> "AttentionBias":
        """Layer ``index``'s bias: the layer's factor folded into the slopes (and the dense bias)."""
        scale = self.layer_scale
        if not self.per_layer or scale is None:
            return self
        dense = self.dense
        return AttentionBias(
            self.xy,
            self.slopes * scale[index],
            self.rays,
            self.directed,
            self.num_prefix,
            None if dense is None else dense * scale[index],
            False,
            None,
            self.block_bytes,
        )

    def block(self, start: int, stop: int) -> Tensor:
        """The bias of queries ``start:stop`` against every key: ``([B,] heads, stop - start, N)``."""
        dense = self.dense
        if dense is not None:
            return dense[..., start:stop, :]
        query = self.xy[..., start:stop, :]
        offset = self.xy.unsqueeze(-3) - query.unsqueeze(-2)  # key minus query: ([B,] r, N, 2)
        bias = -self.slopes[:, None, None] * torch.linalg.vector_norm(offset, dim=-1).unsqueeze(
            -3
        )  # ([B,] heads, r, N)
        dx, dy = offset[..., 0].unsqueeze(-3), offset[..., 1].unsqueeze(-3)  # ([B,] 1, r, N)
        rays = self.rays.to(offset.dtype)[..., None, None]  # (heads, 2 rays, 2 coordinates, 1, 1)
        ax, ay, bx, by = rays[:, 0, 0], rays[:, 0, 1], rays[:, 1, 0], rays[:, 1, 1]
        inside = (ax * dy - ay * dx >= 0) & (dx * by - dy * bx >= 0)  # counter-clockwise of one, clockwise of other
        visible = inside | ~self.directed[:, None, None]
        bias = bias.masked_fill(~visible, float("-inf"))
        p = self.num_prefix
        if p > 0:  # prefix tokens: seen by every query, and seeing every key, unpenalised
            prefix_key = torch.arange(bias.shape[-1], device=bias.device) < p
            prefix_query = torch.arange(start, stop, device=bias.device)[:, None] < p
            bias = bias.masked_fill(prefix_key | prefix_query, 0.0)
        return bias

    @torch.jit.unused
    def densified(self) -> "AttentionBias":
        """The same bias with its dense form precomputed (for a grid small enough to hold it)."""
        return self.replace(dense=self.block(0, self.num_tokens))

    @torch.jit.unused
    def gather(self, rows: Tensor) -> "AttentionBias":
        """Each sample's tokens ``rows (B, T)`` (prefix rows included)."""
        rows = rows.to(self.xy.device)
        xy = self.xy[rows] if self.xy.dim() == 2 else self.xy.gather(1, rows[..., None].expand(-1, -1, 2))
        dense = self.dense
        if dense is not None:
            dense = torch.stack([dense[..., i][..., i, :] for i in rows])  # (B, heads, T, T)
        return self.replace(xy=xy, dense=dense)

    @torch.jit.unused
    def with_prefix(self, n: int) -> "AttentionBias":
        """``n`` prefix tokens first (their places in ``xy`` are placeholders: they have no position)."""
        xy = torch.cat((self.xy.new_zeros(*self.xy.shape[:-2], n, 2), self.xy), dim=-2)
        dense = self.dense
        if dense is not None:
            dense = _prepend(_prepend(dense, n, 0.0, -1), n, 0.0, -2)
        return self.replace(xy=xy, num_prefix=self.num_prefix + n, dense=dense)

    @torch.jit.unused
    def to(self, dtype: torch.dtype) -> "AttentionBias":
        return self.with_tensors(*(None if t is None else t.to(dtype) for t in self.tensors()))

    @torch.jit.unused
    def tensors(self) -> tuple:
        return self.xy, self.slopes, self.dense, self.layer_scale

    @torch.jit.unused
    def with_tensors(self, xy, slopes, dense, layer_scale) -> "AttentionBias":
        return self.replace(xy=xy, slopes=slopes, dense=dense, layer_scale=layer_scale)

    @torch.jit.unused
    def replace(self, **changes) -> "AttentionBias":
        """A copy with some fields changed."""
        return AttentionBias(**{**vars(self), **changes})


class ParabolicBias:
    """A sum of parabolas over each pair's offset, on the logits (PaPE), applied as extra columns of q and k.

    Query i, key j and head h (a per-head tensor's rows are ``h``) get ``Σ_m [-a_im (w_m · δ)² + b_im (w_m · δ)] / √d``
    with ``δ = p_j - p_i``: parabola m looks along ``w_m`` (``directions ([layer,] heads, M, axes)``), its curvature
    ``a_i = softplus(q_i · curvature)`` and slope ``b_i = q_i · slope`` (``([layer,] heads, dim, M)`` each) come from
    the query; ``d`` is the head dim, so the bias is divided as q·k is. With ``A_i = Σ_m a_im w_m w_mᵀ`` and
    ``β_i = Σ_m b_im w_m`` the sum is ``-δᵀ A_i δ + β_i · δ``, which expands into ``axes² + axes + 1`` products of a
    query column and a key column (:meth:`extend`): the keys' ``vec(p_j p_jᵀ)``, ``p_j`` and 1 against the queries'
    ``-vec(A_i)``, ``2 A_i p_i + β_i`` and ``-p_iᵀ A_i p_i - β_i · p_i``. Nothing of size ``N × N`` is held.

    ``coords ([B,] N, axes)``: token positions (the family centres them: the bias depends on offsets alone, and centred
    coordinates keep the expanded terms, which grow as ``‖p‖²``, small); prefix tokens (the first ``num_prefix``) get
    zero columns, so they see and are seen by every token with no bias.
    """

    def __init__(
        self,
        coords: Tensor,
        directions: Tensor,
        curvature: Tensor,
        slope: Tensor,
        num_prefix: int = 0,
        per_layer: bool = False,
    ) -> None:
        self.coords = coords
        self.directions = directions
        self.curvature = curvature
        self.slope = slope
        self.num_prefix = num_prefix
        self.per_layer = per_layer

    @property
    def num_tokens(self) -> int:
        return self.coords.shape[-2]

    @property
    def num_heads(self) -> int:
        return self.directions.shape[-3]

    def layer(self, index: int) -> "ParabolicBias":
        """The parabolas of model layer ``index`` (a table shared by every layer is returned as it is)."""
        if not self.per_layer:
            return self
        pick = [t.select(0, index) for t in (self.directions, self.curvature, self.slope)]
        return ParabolicBias(self.coords, pick[0], pick[1], pick[2], self.num_prefix, False)

    def extend(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``q, k (B, heads, N, d)`` with the bias's columns appended (zeros up to a multiple of 8 channels, which
        fused attention kernels prefer), so that ``q' · k' = q · k + √d · bias``; in float32 at least: the bias is a
        difference of terms that grow as ``‖p‖²``, and rounding them to 16 bits would move the logits by ~2⁻⁹ of those
        (0.5 at 14×14 under bfloat16 with the init's parabolas, 16 at 64×64), so attention takes them in float32."""
        if torch.jit.is_scripting():
            query, key = self._columns(q)
        else:
            with outside_autocast(q.device.type):  # the expansion cancels large terms: the table's precision
                query, key = self._columns(q)
        key = key.expand(k.shape[0], k.shape[1], k.shape[2], key.shape[-1])
        pad = -(q.shape[-1] + query.shape[-1]) % 8
        if pad > 0:
            query, key = F.pad(query, [0, pad]), F.pad(key, [0, pad])
        dtype = torch.promote_types(q.dtype, torch.float32)
        return torch.cat((q.to(dtype), query.to(dtype)), dim=-1), torch.cat((k.to(dtype), key.to(dtype)), dim=-1)

    def _columns(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """The queries' columns ``(B, heads, N, E)`` and the keys' ``([B,] 1, N, E)``, ``E = axes² + axes + 1``."""
        dtype = torch.promote_types(self.coords.dtype, self.directions.dtype)  # a float64 grid computes in float64
        W = self.directions.to(dtype)  # (heads, M, axes)
        p = self.coords.to(dtype).unsqueeze(-3)  # ([B,] 1, N, axes)
        x = q.to(dtype)
        a = F.softplus(x @ self.curvature.to(dtype))  # (B, heads, N, M): curvatures, positive (decay with distance)
        outer = (W.unsqueeze(-1) * W.unsqueeze(-2)).flatten(-2)  # (heads, M, axes²): w_m w_mᵀ
        A = (a @ outer).unflatten(-1, (W.shape[-1], -1))  # (B, heads, N, axes, axes): A_i = Σ_m a_im w_m w_mᵀ
        # β_i = Σ_m b_im w_m with b_i = slopeᵀ q_i is (slope W)ᵀ q_i: the slopes themselves are never formed
        beta = x @ (self.slope.to(dtype) @ W)  # (B, heads, N, axes)
        Ap = (A * p.unsqueeze(-2)).sum(dim=-1)  # (B, heads, N, axes): A_i p_i
        linear = 2 * Ap + beta  # 2 A_i p_i + β_i
        constant = -((Ap + beta) * p).sum(dim=-1, keepdim=True)  # -p_iᵀ A_i p_i - β_i · p_i
        patch = (torch.arange(p.shape[-2], device=p.device) >= self.num_prefix).to(p.dtype).unsqueeze(-1)
        query = torch.cat((-A.flatten(-2), linear, constant), dim=-1) * patch  # SDPA's 1/√d divides them as q·k
        squares = (p.unsqueeze(-1) * p.unsqueeze(-2)).flatten(-2)  # vec(p_j p_jᵀ)
        key = torch.cat((squares, p, torch.ones_like(p[..., :1])), dim=-1) * patch
        return query, key

    @torch.jit.unused
    def gather(self, rows: Tensor) -> "ParabolicBias":
        """Each sample's tokens ``rows (B, T)`` (prefix rows first, as the caller puts them)."""
        rows = rows.to(self.coords.device)
        c = self.coords
        coords = c[rows] if c.dim() == 2 else c.gather(1, rows[..., None].expand(-1, -1, c.shape[-1]))
        return self.replace(coords=coords)

    @torch.jit.unused
    def with_prefix(self, n: int) -> "ParabolicBias":
        """``n`` prefix tokens first (their coordinates are placeholders: their columns are zero)."""
        coords = torch.cat((self.coords.new_zeros(*self.coords.shape[:-2], n, self.coords.shape[-1]), self.coords), -2)
        return self.replace(coords=coords, num_prefix=self.num_prefix + n)

    @torch.jit.unused
    def to(self, dtype: torch.dtype) -> "ParabolicBias":
        return self.with_tensors(*(t.to(dtype) for t in self.tensors()))

    @torch.jit.unused
    def tensors(self) -> tuple:
        return self.coords, self.directions, self.curvature, self.slope

    @torch.jit.unused
    def with_tensors(self, coords, directions, curvature, slope) -> "ParabolicBias":
        return self.replace(coords=coords, directions=directions, curvature=curvature, slope=slope)

    @torch.jit.unused
    def replace(self, **changes) -> "ParabolicBias":
        """A copy with some fields changed."""
        return ParabolicBias(**{**vars(self), **changes})


Table = RotaryTable | AttentionBias | ParabolicBias


def apply_rotary(x: Tensor, table: RotaryTable, inverse: bool = False) -> Tensor:
    """Rotate ``x (..., N, dim)`` by ``table`` (``inverse=True`` turns back: Rᵀ), checking that they fit; x's dtype."""
    if isinstance(table, AttentionBias | ParabolicBias):
        raise ValueError("an attention bias (LookHere, PaPE) does not rotate vectors: attention adds it to its logits")
    if x.shape[-2] != table.num_tokens:
        raise ValueError(
            f"x has {x.shape[-2]} tokens but the rotary table has {table.num_tokens}; the grid (plus prefix tokens) "
            "must match the sequence length of x"
        )
    return table.rotate(x, inverse)
