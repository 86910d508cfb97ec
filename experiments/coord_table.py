"""The coordinate-check table of docs/parametrizations.md: per cell and setting, the largest |slope| of any size at
steps 0-3 (the settings of tests/test_parametrizations.py: widths 64-512, 6 inits), and the SP baseline's largest
slope after one step; plus GammaNet's AdamW check with layer 1's q/k projections and convs frozen (lr 0), the
diagnosis of its drift. One process per check; prints a markdown table and writes JSON.

    python experiments/coord_table.py --jobs 12 --json coord_table.json
"""

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

import torch

CELLS = ("gla", "deltanet", "gated_deltanet", "kda", "gammanet")
SETTINGS = {"gdn-mup adamw": ("gdn-mup", "adamw", 1e-3, 3), "gdn-mup sgd": ("gdn-mup", "sgd", 0.1, 3),
            "sp adamw": ("sp", "adamw", 1e-3, 1), "sp sgd": ("sp", "sgd", 0.1, 1)}  # fmt: skip
FROZEN = ("layers.1.mixer.q_", "layers.1.mixer.k_")


def check(cell: str, setting: str, freeze: bool = False) -> dict:
    from linrnn.parametrizations import base
    from linrnn.parametrizations.coord_check import coord_check

    torch.set_num_threads(1)
    if freeze:  # layer 1's q and k (projection and conv) keep their init
        groups = base.Applied.param_groups

        def frozen_groups(self, lr, weight_decay=0.0):
            out = []
            for group in groups(self, lr, weight_decay):
                names = group["names"]
                for still in (False, True):
                    picked = [i for i, n in enumerate(names) if n.startswith(FROZEN) == still]
                    if picked:
                        out.append({**group, "params": [group["params"][i] for i in picked],
                                    "names": [names[i] for i in picked], "lr": 0.0 if still else group["lr"]})
            return out

        base.Applied.param_groups = frozen_groups
    parametrization, optimizer, lr, steps = SETTINGS[setting]
    result = coord_check(cell, parametrization, optimizer=optimizer, lr=lr, steps=steps, seeds=range(6))
    sizes = [name for name in result.sizes if not name.startswith("Δ ")]
    slopes = result.slopes()
    if parametrization == "sp":
        name = max(sizes, key=lambda n: slopes[n][1])
        return {"cell": cell, "setting": setting, "frozen": freeze, "size": name, "step": 1, "slope": slopes[name][1]}
    name, step, slope = result.worst_slope()
    return {"cell": cell, "setting": setting, "frozen": freeze, "size": name, "step": step, "slope": slope}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default="coord_table.json")
    args = parser.parse_args()
    tasks = [(cell, setting, False) for cell in CELLS for setting in SETTINGS] + [("gammanet", "gdn-mup adamw", True)]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(check, *zip(*tasks, strict=True)))
    with open(args.json, "w") as file:
        json.dump(rows, file, indent=1)
    print("| cell | " + " | ".join(SETTINGS) + " |\n|---|" + "---|" * len(SETTINGS))
    for cell in CELLS:
        cells = [next(r for r in rows if r["cell"] == cell and r["setting"] == s and not r["frozen"]) for s in SETTINGS]
        print(f"| {cell} | " + " | ".join(f"{r['slope']:+.3f} ({r['size']}, step {r['step']})" for r in cells) + " |")
    for r in rows:
        if r["frozen"]:
            print(f"frozen layer-1 q/k, {r['cell']} {r['setting']}: {r['slope']:+.3f} ({r['size']}, step {r['step']})")


if __name__ == "__main__":
    main()
