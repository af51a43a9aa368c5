"""The reference side of netcl's benchmarks, run as a process of its own by netcl.bench.reference.

Standalone on purpose: it imports neither netcl nor pyopencl (so no OpenCL driver threads share the cores
with the reference), and it may run under another interpreter (NETCL_REFERENCE_PYTHON) that has PyTorch.
Protocol: one JSON line per request on stdin, one JSON line per answer on stdout; the first line written
is {"ready": true, "torch": version or null, "onnxruntime": version or null, "numpy": version}.

Requests: {"model": "lenet" | "resnet20" | "matmul", "mode": "train" | "infer", "batch": B, "seconds": S,
"min_reps": R, "settle_s": W} (matmul: "M", "N", "K" instead of batch and mode; "settle_s": untimed
calls for about W seconds first, to wake the BLAS threads that slept while the other side ran). Answer: {"seconds_per_iteration": t,
"reps": n}, or {"error": "..."}. The first request for a workload builds it and runs two warm-up calls.
{"model": "onnx", "path": P, "input": X.npy, ...}: onnxruntime's inference of the ONNX file P on the array
in X.npy (its graph's one input); with "save_output": Y.npy it runs once, writes the output there and
answers {"saved": "Y.npy"} instead of timing.
"""
import json
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # the NumPy workloads still run
    torch = None
try:
    import onnxruntime
except ImportError:  # only the "onnx" workload needs it
    onnxruntime = None

_workloads = {}


def _lenet():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(500, 10)), (1, 28, 28)


def _resnet20():
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet(nn.Module):
        def __init__(self, blocks=3, num_classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            layers, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2)):
                stage = []
                for i in range(blocks):
                    stage.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                    cin = cout
                layers.append(nn.Sequential(*stage))
            self.layer1, self.layer2, self.layer3 = layers
            self.fc = nn.Linear(64, num_classes)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.layer3(self.layer2(self.layer1(x)))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet(), (3, 32, 32)


def _onnx(request):
    if onnxruntime is None:
        raise RuntimeError("onnxruntime is not installed for this interpreter")
    runtime = onnxruntime.InferenceSession(request["path"], providers=["CPUExecutionProvider"])
    feed = {runtime.get_inputs()[0].name: np.load(request["input"])}
    return lambda: runtime.run(None, feed)[0]


def _build(request):
    model_name = request["model"]
    if model_name == "onnx":
        return _onnx(request)
    if model_name == "matmul":
        rng = np.random.default_rng(0)
        a = rng.standard_normal((request["M"], request["K"])).astype(np.float32)
        b = rng.standard_normal((request["K"], request["N"])).astype(np.float32)
        return lambda: np.matmul(a, b)
    if torch is None:
        raise RuntimeError("PyTorch is not installed for this interpreter")
    torch.manual_seed(0)
    model, shape = {"lenet": _lenet, "resnet20": _resnet20}[model_name]()
    batch = int(request["batch"])
    x = torch.randn(batch, *shape)
    if request.get("mode", "train") == "infer":
        model.eval()

        def infer():
            with torch.no_grad():
                model(x)
        return infer
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def _measure(request) -> dict:
    key = json.dumps({k: v for k, v in request.items()
                      if k not in ("seconds", "min_reps", "settle_s", "save_output")}, sort_keys=True)
    if "save_output" in request:
        call = _workloads.get(key) or _build(request)
        np.save(request["save_output"], call())
        return {"saved": request["save_output"]}
    if key not in _workloads:
        _workloads[key] = _build(request)
        _workloads[key]()
        _workloads[key]()
    call = _workloads[key]
    seconds, min_reps = float(request.get("seconds", 1.0)), int(request.get("min_reps", 3))
    settle_s = float(request.get("settle_s", 0.0))
    if settle_s > 0:  # as netcl.bench.reference._wake does on netcl's side
        start = time.perf_counter()
        while time.perf_counter() - start < settle_s:
            call()
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < seconds:
        call()
        reps += 1
    return {"seconds_per_iteration": (time.perf_counter() - start) / reps, "reps": reps}


def main() -> int:
    print(json.dumps({"ready": True, "torch": torch.__version__ if torch else None,
                      "onnxruntime": onnxruntime.__version__ if onnxruntime else None, "numpy": np.__version__,
                      "threads": torch.get_num_threads() if torch else None}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = _measure(json.loads(line))
        except Exception as exc:  # reported to the parent, which decides what to do
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
