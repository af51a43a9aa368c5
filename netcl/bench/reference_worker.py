"""The reference side of netcl's benchmarks, run as a process of its own by netcl.bench.reference.

Standalone on purpose: it imports neither netcl nor pyopencl (so no OpenCL driver threads share the cores
with the reference), and it may run under another interpreter (NETCL_REFERENCE_PYTHON) that has PyTorch.
Protocol: one JSON line per request on stdin, one JSON line per answer on stdout; the first line written
is {"ready": true, "torch": version or null, "onnxruntime": version or null, "numpy": version}.

Requests: {"model": "lenet" | "resnet20" | "matmul", "mode": "train" | "infer", "batch": B, "seconds": S,
"min_reps": R, "settle_s": W} (matmul: "M", "N", "K" instead of batch and mode; "settle_s": untimed
calls for about W seconds first, to wake the BLAS threads that slept while the other side ran). Answer: {"seconds_per_iteration": t,
"reps": n}, or {"error": "..."}. The first request for a workload builds it and runs two warm-up calls.

torchvision's ImageNet networks, written out here in PyTorch with torchvision's module names (its wheel
does not import beside every torch): "model": "resnet18" | "resnet50" | "mobilenet_v2" with "image_size"
(default 224), "num_classes" (1000) and "weights" (an .npz of the state_dict as NumPy arrays, so that both
frameworks run the same network). "model": "onnx" with "path" and "input" (an .npy file) or "input_shape" (random data) runs an
ONNX file on onnxruntime's CPU provider (inference only); a request with "export_onnx": PATH writes the PyTorch model as
an ONNX file there instead of timing it (TorchScript exporter, opset 17), and one with "predict": PATH
(an .npy input) answers {"output": the path of the eval-mode output, saved as .npy}. A request with "peak_memory": true builds its workload anew
and answers {"peak_memory_bytes", "baseline_bytes", "peak_reset"}: the peak resident memory of this
process over its resident memory before the build, during "steps" calls after "warmup" calls (see
:func:`peak_over_baseline`); send it to a fresh process, whose baseline is then the interpreter's own.
With "save_output": Y.npy a request runs its workload once, writes the output there and answers
{"saved": "Y.npy"} instead of timing.

PyTorch's workloads run on the torch device named by the argument ``--device`` (such as "cuda" or
"cuda:0"; default "cpu"; the parent passes NETCL_REFERENCE_DEVICE), so that netcl on a GPU is compared
with PyTorch on the same GPU: with PyTorch's defaults for timing (cuDNN's convolutions in TF32 where the
GPU has it), in float32 throughout for "predict"; each call then waits for the device, and the ready line
says which device ("torch_device"). The ONNX export and onnxruntime stay on the CPU; peak memory is always
this process's resident memory.
"""
import argparse
import gc
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


def _torch_device(name: str):
    """PyTorch's device ``name`` for the workloads, checked at first use (a clear error instead of CUDA's)."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"NETCL_REFERENCE_DEVICE={name}, but this PyTorch ({torch.__version__}) "
                           f"sees no CUDA device")
    return device


def _synchronized(call, device):
    """``call`` followed by a wait for ``device``'s queued work, so that the time of a call is its run."""
    if device.type != "cuda":
        return call

    def run():
        result = call()
        torch.cuda.synchronize(device)
        return result
    return run


def _lenet():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(500, 10)), (1, 28, 28)


def _residual_block(bottleneck: bool):
    """torchvision's BasicBlock (``bottleneck`` False; also He et al.'s CIFAR block) or Bottleneck class,
    built as Block(in channels, width, stride): relu(main path + shortcut), the shortcut a strided 1x1
    convolution and BatchNorm where the shape changes."""
    nn = torch.nn
    expansion = 4 if bottleneck else 1

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * expansion
            if bottleneck:  # 1x1 reduce, 3x3 with the stride (torchvision's "v1.5"), 1x1 expand
                self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(width)
                self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(width)
                self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
                self.bn3 = nn.BatchNorm2d(cout)
            else:
                self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(width)
                self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if bottleneck:
                out = self.bn3(self.conv3(self.relu(out)))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    Block.expansion = expansion
    return Block


def _resnet20():
    nn = torch.nn
    BasicBlock = _residual_block(False)

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
    if "input" in request:
        x = np.load(request["input"])
    else:
        x = np.random.default_rng(0).standard_normal(request["input_shape"]).astype(np.float32)
    feed = {runtime.get_inputs()[0].name: x}
    return lambda: runtime.run(None, feed)[0]


def _imagenet_resnet(bottleneck: bool, layers, num_classes: int):
    """torchvision.models.resnet18/50's architecture, module names and state_dict keys."""
    nn = torch.nn
    Block = _residual_block(bottleneck)
    expansion = Block.expansion

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin = 64
            for index, (width, stride, count) in enumerate(zip((64, 128, 256, 512), (1, 2, 2, 2), layers), 1):
                blocks = []
                for i in range(count):
                    blocks.append(Block(cin, width, stride if i == 0 else 1))
                    cin = width * expansion
                setattr(self, f"layer{index}", nn.Sequential(*blocks))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * expansion, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


def _mobilenet_v2(num_classes: int):
    """torchvision.models.mobilenet_v2's architecture (width 1.0), module names and state_dict keys."""
    nn = torch.nn

    def conv_bn_relu6(cin, cout, kernel=3, stride=1, groups=1):  # torchvision's Conv2dNormActivation
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            self.use_res_connect = stride == 1 and cin == cout
            layers = [conv_bn_relu6(cin, hidden, 1)] if expand != 1 else []
            layers += [conv_bn_relu6(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, cout, 1, bias=False),
                       nn.BatchNorm2d(cout)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            features, cin = [conv_bn_relu6(3, 32, stride=2)], 32
            for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                               (6, 160, 3, 2), (6, 320, 1, 1)):
                for i in range(n):
                    features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            features.append(conv_bn_relu6(cin, 1280, 1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    return MobileNetV2()


IMAGENET_MODELS = {"resnet18": lambda k: _imagenet_resnet(False, (2, 2, 2, 2), k),
                   "resnet50": lambda k: _imagenet_resnet(True, (3, 4, 6, 3), k),
                   "mobilenet_v2": _mobilenet_v2}


def _torch_model(request):
    """(model, input shape, classes) of a request's PyTorch workload; weights from "weights" if given."""
    name = request["model"]
    if name in IMAGENET_MODELS:
        classes, size = int(request.get("num_classes", 1000)), int(request.get("image_size", 224))
        model = IMAGENET_MODELS[name](classes)
        if request.get("weights"):
            with np.load(request["weights"]) as arrays:
                model.load_state_dict({key: torch.from_numpy(arrays[key]) for key in arrays.files})
        return model, (3, size, size), classes
    model, shape = {"lenet": _lenet, "resnet20": _resnet20}[name]()
    return model, shape, 10


def _build(request, device_name: str = "cpu"):
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
    device = _torch_device(device_name)
    model, shape, classes = _torch_model(request)
    model.to(device)
    batch = int(request["batch"])
    x = torch.randn(batch, *shape).to(device)
    if request.get("mode", "train") == "infer":
        model.eval()

        def infer():
            with torch.no_grad():
                model(x)
        return _synchronized(infer, device)
    y = torch.randint(0, classes, (batch,)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return _synchronized(step, device)


def _status_bytes(field: str) -> int:
    """A "VmRSS"/"VmHWM" line of /proc/self/status in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset the kernel's peak resident memory (VmHWM) to the current one; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def peak_over_baseline(build, warmup: int, steps: int) -> dict:
    """Peak resident memory of this process over its resident memory before ``build()`` made the workload
    (weights, inputs, optimizer state, activations and workspaces, all in host memory on a CPU), during
    ``steps`` calls of the workload after ``warmup`` calls. ``build`` returns (call, sync): sync waits for
    the work the calls queued. Where the peak cannot be reset after the warm-up ("peak_reset": false), it
    covers the warm-up too. Shared with netcl's side (netcl.bench.peak_memory), which imports it."""
    gc.collect()
    baseline = _status_bytes("VmRSS")
    call, sync = build()
    for _ in range(warmup):
        call()
    sync()
    reset = _reset_peak()
    for _ in range(steps):
        call()
    sync()
    return {"peak_memory_bytes": max(0, _status_bytes("VmHWM") - baseline), "baseline_bytes": baseline,
            "peak_reset": reset}


def _export_onnx(request) -> dict:
    """Write the request's PyTorch model (eval mode, its weights) as an ONNX file at "export_onnx"."""
    if torch is None:
        raise RuntimeError("PyTorch is not installed for this interpreter")
    model, shape, _ = _torch_model(request)
    model.eval()
    x = torch.randn(int(request["batch"]), *shape)
    torch.onnx.export(model, x, request["export_onnx"], dynamo=False, opset_version=17)
    return {"exported": request["export_onnx"]}


def _predict(request, device_name: str = "cpu") -> dict:
    """The request's PyTorch model in eval mode on the input stored at "predict" (.npy); the output is
    stored beside it and its path answered."""
    if torch is None:
        raise RuntimeError("PyTorch is not installed for this interpreter")
    device = _torch_device(device_name)
    model, _, _ = _torch_model(request)
    model.to(device).eval()
    # cuDNN's convolutions round their inputs to TF32 by default; the agreement check wants float32's.
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(np.load(request["predict"])).to(device)).cpu().numpy()
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    path = request["predict"] + ".out.npy"
    np.save(path, out)
    return {"output": path}


def _measure(request, device_name: str = "cpu") -> dict:
    """The answer to one request, PyTorch's workloads on the torch device ``device_name``."""
    if request.get("export_onnx"):
        return _export_onnx(request)
    if request.get("predict"):
        return _predict(request, device_name)
    if request.get("peak_memory"):
        return peak_over_baseline(lambda: (_build(request, device_name), lambda: None),
                                  int(request.get("warmup", 2)),
                                  int(request.get("steps", 3)))
    key = json.dumps({k: v for k, v in request.items()
                      if k not in ("seconds", "min_reps", "settle_s", "save_output")}, sort_keys=True)
    if "save_output" in request:
        call = _workloads.get(key) or _build(request, device_name)
        np.save(request["save_output"], call())
        return {"saved": request["save_output"]}
    if key not in _workloads:
        _workloads[key] = _build(request, device_name)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="netcl's benchmark reference process (protocol: see the module)")
    parser.add_argument("--device", default="cpu", help="the torch device of PyTorch's workloads")
    device_name = parser.parse_args(argv).device
    print(json.dumps({"ready": True, "torch": torch.__version__ if torch else None,
                      "onnxruntime": onnxruntime.__version__ if onnxruntime else None, "numpy": np.__version__,
                      "threads": torch.get_num_threads() if torch else None,
                      "torch_device": device_name if torch else None}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = _measure(json.loads(line), device_name)
        except Exception as exc:  # reported to the parent, which decides what to do
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
