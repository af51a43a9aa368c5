"""Markdown tables from `netcl bench imagenet --json` output: the summary (images/s, ratios, peak memory) of
every file given, and with --layers the per-layer table of one model and batch size (convolutions and
pooling; BatchNorm and the classifier are in the command's own printout).

    netcl bench imagenet --model resnet18 --batch 1,8 --json > resnet18-pocl.txt
    python benchmarks/imagenet_tables.py resnet18-pocl.txt resnet18-intel.txt
    python benchmarks/imagenet_tables.py --layers resnet18:1 resnet18-pocl.txt

Each file's last line is the JSON object the command ends with; the driver is named from its device.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(path: str) -> dict:
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return json.loads(lines[-1])


def driver_name(device: str) -> str:
    return "Intel's runtime" if "Intel" in device else "Debian's PoCL" if "Portable" in device else device


def _ratio(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _rate(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def summary(results: list[dict]) -> str:
    rows = ["| model | batch | driver | inference img/s (ms per batch) | PyTorch | netcl / PyTorch | onnxruntime "
            "| netcl / onnxruntime | training img/s | PyTorch | netcl / PyTorch | peak MiB (PyTorch) |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for device, r in results:
        peak = r.get("peak_memory_bytes")
        torch_peak = r.get("torch_peak_memory_bytes")
        memory = "–" if peak is None else f"{peak / 2**20:.0f}" + ("" if torch_peak is None else f" ({torch_peak / 2**20:.0f})")
        rows.append(
            f"| {r['model']} | {r['batch']} | {driver_name(device)} | {r['inference_images_per_second']:.1f} "
            f"({r['inference_ms_per_batch']:.1f}) | {_rate(r.get('torch_inference_images_per_second'))} "
            f"| {_ratio(r.get('inference_ratio_to_torch'))} | {_rate(r.get('onnxruntime_inference_images_per_second'))} "
            f"| {_ratio(r.get('inference_ratio_to_onnxruntime'))} | {r['training_images_per_second']:.1f} "
            f"| {_rate(r.get('torch_training_images_per_second'))} | {_ratio(r.get('training_ratio_to_torch'))} "
            f"| {memory} |")
    return "\n".join(rows)


def layers(result: dict) -> str:
    rows = ["| layer | shape | forward | backward_data | backward_weight |", "| --- | --- | --- | --- | --- |"]
    by_name: dict[str, dict] = {}
    for row in result["layers"]:
        by_name.setdefault(row["name"], {})[row["pass"]] = row
    for name, passes in by_name.items():
        if "shape" in passes.get("forward", {}):
            cells = []
            for p in ("forward", "backward_data", "backward_weight"):
                row = passes.get(p)
                if row is None:
                    cells.append("–")
                    continue
                note = "" if row.get("in_training", True) else " (not in training)"
                bound = " of copy" if row.get("bound") == "memory" else ""
                cells.append(f"{row['strategy']} {row['ms']:.2f} ms, {row['share']:.0%}{bound}{note}")
            rows.append(f"| {name} | {passes['forward']['shape']} | " + " | ".join(cells) + " |")
        elif "Pool" in passes.get("forward", {}).get("strategy", ""):
            f, fb = passes["forward"], passes.get("forward+backward")
            back = "–" if fb is None else f"forward+backward {fb['ms']:.2f} ms, {fb['share']:.0%}"
            rows.append(f"| {name} | {f['strategy']} | {f['ms']:.2f} ms, {f['share']:.0%} of copy | {back} of copy | |")
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--layers", default=None, help="MODEL:BATCH: print that configuration's per-layer table")
    a = p.parse_args(argv)
    runs = [load(f) for f in a.files]
    if a.layers:
        model, batch = a.layers.split(":")
        for run in runs:
            for r in run["results"]:
                if r["model"] == model and r["batch"] == int(batch):
                    print(f"{model} at batch {batch}, {driver_name(run['device'])}: strategy, ms and share of the "
                          f"device's GEMM rate ({run['device_rates']['gemm_gflops']:.0f} GFLOP/s), or where the "
                          f"layer is memory-bound of its copy bandwidth "
                          f"({run['device_rates']['copy_gbps']:.1f} GB/s)\n")
                    print(layers(r))
        return
    print(summary([(run["device"], r) for run in runs for r in run["results"]]))


if __name__ == "__main__":
    main()
