"""Turns a pytest-benchmark JSON of the GPU benchmarks into the markdown tables of RESULTS.md (medians, ratio to FLA).

Decode (benchmarks/test_decode_gpu.py) and chunkwise training (benchmarks/test_chunk_gpu.py, extra_info kind "chunk")
JSONs both work: ``python benchmarks/report.py decode.json`` or ``... chunk.json``.
"""

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    runs = json.load(open(path))
    medians = defaultdict(dict)  # (cell, batch) -> {impl: seconds}
    prefill = defaultdict(dict)  # (cell, steps) -> {impl: seconds}
    chunk, model, generate, pairs, short_conv, agreement = [], [], [], [], [], []
    for bench in runs["benchmarks"]:
        info = bench["extra_info"]
        if info.get("kind") == "model":
            model.append(info)
        elif info.get("kind") == "pair":
            pairs.append(info)
        elif info.get("kind") == "generate":
            generate.append(info)
        elif info.get("kind") == "chunk":
            chunk.append(dict(info, median=bench["stats"]["median"]))
        elif info.get("kind") == "short_conv":
            short_conv.append(dict(info, median=bench["stats"]["median"]))
        elif info.get("kind") == "state_agreement":
            agreement.append(info)
        elif info.get("kind") == "prefill":
            prefill[(info["cell"], info["steps"])][info["impl"]] = bench["stats"]["median"]
        else:
            medians[(info["cell"], info["batch"])][info["impl"]] = bench["stats"]["median"]
    gpus = {bench["extra_info"]["device"] for bench in runs["benchmarks"] if "device" in bench["extra_info"]}
    gpu = f"{', '.join(sorted(gpus))} on an " if gpus else ""
    print(f"device: {gpu}{runs['machine_info'].get('cpu', {}).get('brand_raw', '?')} host; {runs.get('datetime', '')}")
    if chunk:
        chunk_tables(chunk)
    if model:
        model_table(model)
    if pairs:
        pair_table(pairs)
    if generate:
        generate_table(generate)
    if short_conv:
        short_conv_table(short_conv)
    for info in agreement:
        print(
            f"\n{info['model']}, bf16 state against fp32, {info['batch']} prompts of {info['prompt']} tokens, "
            f"{info['new']} greedy tokens each: {info['equal_fraction']:.1%} of tokens equal; first difference "
            f"per row at {info['first_difference']}"
        )
    if not medians:
        return
    print("| cell | batch | linrnn (µs) | linrnn torch path (µs) | FLA (µs) | linrnn / FLA | linrnn tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (cell, batch), impls in sorted(medians.items()):
        ours, torch_path, fla = impls.get("linrnn"), impls.get("linrnn_torch"), impls.get("fla")
        ratio = f"{ours / fla:.2f}" if ours and fla else "-"
        cells = [f"{t * 1e6:.1f}" if t else "-" for t in (ours, torch_path, fla)]
        print(f"| {cell} | {batch} | {' | '.join(cells)} | {ratio} | {batch / ours:,.0f} |")
    if prefill:
        print("\n| prefill, no grad, B = 8 | T | triton (ms) | torch chunked (ms) |")
        print("|---|---:|---:|---:|")
        for (cell, steps), impls in sorted(prefill.items()):
            print(f"| {cell} | {steps} | {impls['triton'] * 1e3:.2f} | {impls['torch'] * 1e3:.2f} |")


def chunk_tables(rows: list[dict]) -> None:
    """One table per shape: linrnn vs FLA per (cell, mode), with causal SDPA at the same shape and mode."""
    by_shape = defaultdict(dict)  # shape -> {(cell, mode, impl): row}
    for row in rows:
        by_shape[(row["batch"], row["steps"])][(row["cell"], row["mode"], row["impl"])] = row
    for (batch, steps), runs in by_shape.items():  # in the order they ran
        some = next(iter(runs.values()))
        widths = (
            f"K = V = {some['K']}" if some.get("V", some["K"]) == some["K"] else f"K = {some['K']}, V = {some['V']}"
        )
        print(f"\n### B×T = {batch}×{steps}, H = {some['H']}, {widths}, {some['dtype']}\n")
        print("| cell | mode | linrnn ms | FLA ms | linrnn/FLA | SDPA ms | peak MiB linrnn | peak MiB FLA |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        cells = dict.fromkeys(cell for cell, _, _ in runs if cell != "sdpa") or ["-"]  # "-": SDPA alone
        for cell in cells:
            for mode in ("fwd", "fwdbwd"):
                ours, fla = runs.get((cell, mode, "linrnn")), runs.get((cell, mode, "fla"))
                sdpa = runs.get(("sdpa", mode, "sdpa"))
                if not (ours or fla or sdpa):
                    continue
                ms = [f"{r['median'] * 1e3:.3f}" if r else "-" for r in (ours, fla)]
                ratio = f"{ours['median'] / fla['median']:.2f}" if ours and fla else "-"
                sdpa_ms = f"{sdpa['median'] * 1e3:.3f}" if sdpa else "-"
                mib = [f"{r['peak_mib']:.0f}" if r and r.get("peak_mib") is not None else "-" for r in (ours, fla)]
                print(f"| {cell} | {mode} | {ms[0]} | {ms[1]} | {ratio} | {sdpa_ms} | {mib[0]} | {mib[1]} |")
    backends = sorted({r["backend"] for r in rows if r["impl"] == "linrnn"})
    lifted = any(r.get("fla_bwd_guard_lifted") for r in rows)
    print(f"\nlinrnn backend: {', '.join(backends) or '-'}. Host medians with a device sync per call.")
    if lifted:
        print("FLA's Hopper guard on its gated backward (triton < 3.7.1, its issue #640) was lifted: speed only.")


def model_table(rows: list[dict]) -> None:
    """benchmarks/test_model_gpu.py: tokens/s and peak memory (allocated, and reserved: a CUDA graph's pool shows only
    there) per model and shape, with the ratios to FLA's model of the same cell and to the Llama in the same run."""
    print("| shape | model | tokens/s | best step tokens/s | spread | peak GiB | reserved GiB | × FLA (same cell) | "
          "× Llama | params | last loss |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by_shape = defaultdict(dict)
    for row in rows:
        by_shape[(row["batch"], row["steps"])][row["model"]] = row
    for (batch, steps), models in by_shape.items():
        llama = models.get("llama", {}).get("tokens_per_s")
        for name, row in models.items():
            cell = name.split("_")[1] if "_" in name else None
            fla = models.get(f"fla_{cell}", {}).get("tokens_per_s")
            versus_fla, versus_llama = (_ratio(row["tokens_per_s"], peer) for peer in (fla, llama))
            peak, reserved = (f"{row[key]:.1f}" if row.get(key) is not None else "–"
                              for key in ("peak_gib", "reserved_gib"))  # fmt: skip
            best = f"{row['best_tokens_per_s']:,.0f}" if "best_tokens_per_s" in row else "–"
            spread = f"{100 * row['spread']:.0f}%" if "spread" in row else "–"
            print(
                f"| {batch}×{steps} | {name} | {row['tokens_per_s']:,.0f} | {best} | {spread} | {peak} | {reserved} | "
                f"{versus_fla} | "
                f"{versus_llama} | "
                f"{row['params'] / 1e6:.1f}M | {row['last_loss']:.3f} |"
            )


def pair_table(rows: list[dict]) -> None:
    """benchmarks/test_model_gpu.py's alternating pairs: each model's median tokens/s and A's speed-up over B as the
    median (and range) of the per-round step-time ratios."""
    print("\n| shape | A | B | A tokens/s | B tokens/s | A's speed-up (median of rounds) | range | rounds |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for row in rows:
        spread = f"{row['speedup_low']:.2f}–{row['speedup_high']:.2f}"
        print(f"| {row['batch']}×{row['steps']} | {row['a']} | {row['b']} | {row['a_tokens_per_s']:,.0f} | "
              f"{row['b_tokens_per_s']:,.0f} | {row['speedup']:.2f} | {spread} | {row['rounds']} |")  # fmt: skip


def generate_table(rows: list[dict]) -> None:
    """benchmarks/test_generate_gpu.py: decode step time and tokens/s per model and setting, with the ratio to the
    Llama in the same run, and the decode state per sequence (linrnn) or KV cache per sequence (the Llama)."""
    print("| batch × prompt | model | ms / step | decode tokens/s | × Llama | prefill s | state or KV cache per "
          "sequence | peak GiB |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|")
    by_setting = defaultdict(dict)
    for row in rows:
        by_setting[(row["batch"], row["prompt"])][row["model"]] = row
    for (batch, prompt), models in by_setting.items():
        llama = models.get("llama", {}).get("decode_tokens_per_s")
        for name, row in models.items():
            if "state_bytes_per_sequence" in row:
                memory = f"state {row['state_bytes_per_sequence'] / 2**20:.1f} MiB"
            elif "kv_cache_bytes_per_sequence" in row:
                memory = (f"KV {row['kv_cache_bytes_per_sequence'] / 2**20:.0f} MiB "
                          f"({row['kv_cache_bytes_at_32k'] / 2**20:.0f} MiB at 32k)")  # fmt: skip
            else:
                memory = "–"
            peak = f"{row['peak_gib']:.1f}" if row.get("peak_gib") is not None else "–"
            versus_llama = _ratio(row["decode_tokens_per_s"], llama)
            print(f"| {batch}×{prompt} | {name} | {row['ms_per_step']:.2f} | {row['decode_tokens_per_s']:,.0f} | "
                  f"{versus_llama} | {row['prefill_s']:.2f} | {memory} | {peak} |")  # fmt: skip


def short_conv_table(rows: list[dict]) -> None:
    """benchmarks/test_short_conv_gpu.py: linrnn vs FLA per shape, layout (rows or packed documents) and mode."""
    runs = {(r["batch"], r["steps"], r["packed"], r["mode"], r["impl"]): r for r in rows}
    some = rows[0]
    print(f"\nShort convolution + SiLU, C = {some['channels']}, W = {some['width']}, bf16")
    print("| B×T | layout | mode | linrnn ms | FLA ms | linrnn/FLA | peak MiB linrnn | peak MiB FLA |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for batch, steps, packed, mode in dict.fromkeys(key[:4] for key in runs):
        ours, fla = runs.get((batch, steps, packed, mode, "linrnn")), runs.get((batch, steps, packed, mode, "fla"))
        ms = [f"{r['median'] * 1e3:.3f}" if r else "-" for r in (ours, fla)]
        mib = [f"{r['peak_mib']:.0f}" if r else "-" for r in (ours, fla)]
        ratio = f"{ours['median'] / fla['median']:.2f}" if ours and fla else "-"
        layout = f"packed ({(ours or fla)['documents']} documents)" if packed else "rows"
        print(f"| {batch}×{steps} | {layout} | {mode} | {ms[0]} | {ms[1]} | {ratio} | {mib[0]} | {mib[1]} |")


def _ratio(value: float, peer: float | None) -> str:
    return f"{value / peer:.2f}" if peer else "–"


if __name__ == "__main__":
    main(sys.argv[1])
