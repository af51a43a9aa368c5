"""The convolution layer tables `netcl plan`, `netcl tune conv` and the planner benchmark use."""
from __future__ import annotations

from ..ops.conv_common import ConvLayer


def lenet_layers(batch: int) -> list:
    """The two convolutions of the modified LeNet (seeds/000, Table 2)."""
    return [("conv1", ConvLayer.from_shapes((batch, 1, 28, 28), (20, 1, 5, 5))),
            ("conv2", ConvLayer.from_shapes((batch, 20, 12, 12), (50, 20, 5, 5)))]


# cv1–cv12 of the MEC paper (Cho and Brand, "MEC: Memory-efficient Convolution for Deep Neural Network",
# ICML 2017, Table 2): input ih×iw×ic, kernel kh×kw×oc, stride; no padding.
MEC_LAYERS = (
    ("cv1", 227, 3, 11, 96, 4), ("cv2", 231, 3, 11, 96, 4), ("cv3", 227, 3, 7, 64, 2),
    ("cv4", 224, 64, 7, 64, 2), ("cv5", 24, 96, 5, 256, 1), ("cv6", 12, 256, 3, 512, 1),
    ("cv7", 224, 3, 3, 64, 1), ("cv8", 112, 64, 3, 128, 1), ("cv9", 56, 64, 3, 64, 1),
    ("cv10", 28, 128, 3, 128, 1), ("cv11", 14, 256, 3, 256, 1), ("cv12", 7, 512, 3, 512, 1),
)


def mec_layers(batch: int) -> list:
    return [(name, ConvLayer.from_shapes((batch, c, hw, hw), (k, c, r, r), stride=s))
            for name, hw, c, r, k, s in MEC_LAYERS]


def resnet20_layers(batch: int, in_channels: int = 3, size: int = 32) -> list:
    """The distinct convolutions of ResNet-20 (nc.models.resnet20, He et al. 2016 §4.2): the 3×3 stem,
    the 3×3 convolutions of the three stages (16, 32, 64 channels at 32, 16, 8 pixels), the stride-2
    first convolutions of stages 2 and 3, and their 1×1 stride-2 projections (downsample.0). Layers that
    repeat with the same shape are listed once, with the names of their first use."""
    half, quarter = -(-size // 2), -(-size // 4)
    spec = [
        ("conv1", (in_channels, size), (16, 3), 1, 1),
        ("layer1.0.conv1", (16, size), (16, 3), 1, 1),
        ("layer2.0.conv1", (16, size), (32, 3), 2, 1),
        ("layer2.0.conv2", (32, half), (32, 3), 1, 1),
        ("layer2.0.downsample.0", (16, size), (32, 1), 2, 0),
        ("layer3.0.conv1", (32, half), (64, 3), 2, 1),
        ("layer3.0.conv2", (64, quarter), (64, 3), 1, 1),
        ("layer3.0.downsample.0", (32, half), (64, 1), 2, 0),
    ]
    return [(name, ConvLayer.from_shapes((batch, c, hw, hw), (k, c, r, r), stride=st, padding=pad))
            for name, (c, hw), (k, r), st, pad in spec]


def held_out_layers(batch: int) -> list:
    """Layers the calibration never sees (ResNet-, VGG- and MobileNet-like): strided, 1×1, depthwise,
    dilated, 7×7 stems. The planner benchmark checks its choices on them."""
    spec = [
        ("resnet.stem7x7", (3, 64), (32, 3, 7), 2, 3, 1, 1),
        ("resnet.3x3s2", (64, 28), (128, 64, 3), 2, 1, 1, 1),
        ("resnet.1x1s2", (64, 28), (128, 64, 1), 2, 0, 1, 1),
        ("resnet.1x1", (128, 14), (256, 128, 1), 1, 0, 1, 1),
        ("vgg.3x3", (64, 28), (64, 64, 3), 1, 1, 1, 1),
        ("vgg.3x3c128", (128, 14), (128, 128, 3), 1, 1, 1, 1),
        ("mobilenet.dw3x3", (64, 28), (64, 1, 3), 1, 1, 1, 64),
        ("mobilenet.dw3x3s2", (64, 28), (64, 1, 3), 2, 1, 1, 64),
        ("mobilenet.pw1x1", (64, 14), (128, 64, 1), 1, 0, 1, 1),
        ("dilated.3x3d2", (32, 28), (32, 32, 3), 1, 2, 2, 1),
    ]
    return [(name, ConvLayer.from_shapes((batch, c, hw, hw), (k, cg, r, r), stride=st, padding=pad,
                                         dilation=dil, groups=g))
            for name, (c, hw), (k, cg, r), st, pad, dil, g in spec]


def second_held_out_layers(batch: int) -> list:
    """A second set the calibration never sees and no change to the cost model was checked against:
    kernels that are not square (Inception's 1×7, 7×1 and 1×3), ResNet-50's bottleneck 1×1 and 3×3 at
    56 pixels, a grouped ResNeXt 3×3 (32 groups of 4 channels), a strided 5×5 depthwise layer, a 3×3
    dilated by 4 (DeepLab), SqueezeNet's expanding 1×1 and an odd 5×5 layer of stride 3."""
    def layer(c, hw, k, kernel, stride=1, padding=0, dilation=1, groups=1):
        return ConvLayer.from_shapes((batch, c, hw, hw), (k, c // groups) + kernel, stride=stride,
                                     padding=padding, dilation=dilation, groups=groups)
    return [("inception.1x7", layer(128, 17, 128, (1, 7), padding=(0, 3))),
            ("inception.7x1", layer(128, 17, 128, (7, 1), padding=(3, 0))),
            ("inception.1x3", layer(96, 17, 96, (1, 3), padding=(0, 1))),
            ("resnet50.1x1reduce", layer(256, 56, 64, (1, 1))),
            ("resnet50.3x3", layer(64, 56, 64, (3, 3), padding=1)),
            ("resnext.3x3g32", layer(128, 28, 128, (3, 3), padding=1, groups=32)),
            ("mobilenet.dw5x5s2", layer(120, 28, 120, (5, 5), stride=2, padding=2, groups=120)),
            ("deeplab.3x3d4", layer(64, 33, 64, (3, 3), padding=4, dilation=4)),
            ("squeezenet.expand1x1", layer(16, 55, 64, (1, 1))),
            ("odd.5x5s3", layer(24, 47, 40, (5, 5), stride=3))]


def imagenet_layers(batch: int) -> list:
    """Convolutions of ImageNet-class networks at 224 pixels (torchvision's ResNet-18/50 and MobileNetV2)
    that neither the calibration nor the held-out sets hold: the 7×7 stride-2 stem on 3 channels, strided
    3×3 and 1×1 layers, 1×1 convolutions (at batch 1 one small product each) and MobileNetV2's depthwise
    layers from 112 to 7 pixels, stride 1 and 2."""
    def layer(c, hw, k, kernel, stride=1, padding=0, groups=1):
        return ConvLayer.from_shapes((batch, c, hw, hw), (k, c // groups, kernel, kernel), stride=stride,
                                     padding=padding, groups=groups)
    return [("resnet.stem7x7s2", layer(3, 224, 64, 7, stride=2, padding=3)),
            ("resnet18.3x3", layer(64, 56, 64, 3, padding=1)),
            ("resnet18.3x3s2", layer(128, 28, 256, 3, stride=2, padding=1)),
            ("resnet18.1x1s2", layer(64, 56, 128, 1, stride=2)),
            ("resnet50.1x1expand", layer(64, 56, 256, 1)),
            ("resnet50.1x1reduce7", layer(2048, 7, 512, 1)),
            ("mobilenetv2.stem3x3s2", layer(3, 224, 32, 3, stride=2, padding=1)),
            ("mobilenetv2.dw112", layer(32, 112, 32, 3, padding=1, groups=32)),
            ("mobilenetv2.dw112s2", layer(96, 112, 96, 3, stride=2, padding=1, groups=96)),
            ("mobilenetv2.dw56", layer(144, 56, 144, 3, padding=1, groups=144)),
            ("mobilenetv2.dw14", layer(384, 14, 384, 3, padding=1, groups=384)),
            ("mobilenetv2.dw7", layer(960, 7, 960, 3, padding=1, groups=960)),
            ("mobilenetv2.pw56", layer(144, 56, 24, 1)),
            ("mobilenetv2.pw14", layer(64, 14, 384, 1))]


NETWORKS = {"lenet": lenet_layers, "mec": mec_layers, "resnet20": resnet20_layers}
