"""Do tensor descriptors (TMA on Hopper) pay off over masked pointer loads for the chunk kernels' access pattern?

The probe kernel has the shape of the forward state pass (``chunk_state_fwd_kernel``), the one sequential kernel:
one program per (value block, sequence × head) walks the sequence's chunks and per chunk loads a ``[BT, K]`` key
tile, a ``[BT, K]`` W tile and a ``[BT, BV]`` value tile, forms ``U = V − W S`` and ``S += Kᵀ U``, and stores U.
It is built twice, loading through ``linrnn.kernels.triton.tiles`` (pointers and masks) or through
``tl.make_tensor_descriptor``, and both are checked against each other and timed (median of
``triton.testing.do_bench``) at B×T ∈ {8×4096, 2×16384}, H = 16, K = V = 128, bf16.

Run on the GPU machine: ``python3 experiments/tma_probe.py``.
"""

import functools

import torch
import triton
import triton.language as tl

from linrnn.kernels.triton.tiles import load_head_tile, store_head_tile

BT, BV = 64, 64


@triton.jit
def state_pass_kernel(k, w, v, u, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                      BV: tl.constexpr, DESCRIPTORS: tl.constexpr):  # fmt: skip
    vb, nh = tl.program_id(0), tl.program_id(1)
    n, h = nh // H, nh % H
    bos = n.to(tl.int64) * T
    state = tl.zeros([K, BV], dtype=tl.float32)
    if DESCRIPTORS:
        k_desc = tl.make_tensor_descriptor(k + (bos * H + h) * K, [T, K], [H * K, 1], [BT, K])
        w_desc = tl.make_tensor_descriptor(w + (bos * H + h) * K, [T, K], [H * K, 1], [BT, K])
        v_desc = tl.make_tensor_descriptor(v + (bos * H + h) * V, [T, V], [H * V, 1], [BT, BV])
        u_desc = tl.make_tensor_descriptor(u + (bos * H + h) * V, [T, V], [H * V, 1], [BT, BV])
    for c in range(0, tl.cdiv(T, BT)):
        if DESCRIPTORS:
            k_t, w_t = k_desc.load([c * BT, 0]), w_desc.load([c * BT, 0])
            v_t = v_desc.load([c * BT, vb * BV])
        else:
            k_t = load_head_tile(k, bos, T, h, c * BT, 0, H, K, BT, K)
            w_t = load_head_tile(w, bos, T, h, c * BT, 0, H, K, BT, K)
            v_t = load_head_tile(v, bos, T, h, c * BT, vb * BV, H, V, BT, BV)
        u_t = v_t.to(tl.float32) - tl.dot(w_t, state.to(w_t.dtype))
        if DESCRIPTORS:
            u_desc.store([c * BT, vb * BV], u_t.to(u.dtype.element_ty))
        else:
            store_head_tile(u, u_t, bos, T, h, c * BT, vb * BV, H, V, BT, BV)
        state += tl.dot(tl.trans(k_t), u_t.to(k_t.dtype))


def run(k, w, v, descriptors):
    B, T, H, K = k.shape
    V = v.shape[-1]
    u = torch.full_like(v, float("nan"))
    state_pass_kernel[(triton.cdiv(V, BV), B * H)](k, w, v, u, T, H, K, V, BT, BV, descriptors)
    return u


def main():
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    H, D = 16, 128
    for B, T in [(8, 4096), (2, 16384)]:
        gen = torch.Generator(device="cuda").manual_seed(0)
        k, w, v = (0.1 * torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16() for _ in range(3))
        plain, tma = run(k, w, v, False), run(k, w, v, True)
        assert not plain.isnan().any() and not tma.isnan().any(), "unwritten output"
        error = ((plain.float() - tma.float()).norm() / plain.float().norm()).item()
        calls = [functools.partial(run, k, w, v, descriptors) for descriptors in (False, True)]
        times = [triton.testing.do_bench(call, return_mode="median") for call in calls]
        print(f"{B}x{T}: pointers {times[0]:.3f} ms, descriptors {times[1]:.3f} ms, "
              f"descriptors / pointers {times[1] / times[0]:.3f}, relative difference {error:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
