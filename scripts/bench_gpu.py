"""One training step of a model on one device: this project's against torchvision's.

    python -m scripts.bench_gpu --framework jax --model resnet50 --precision bf16
    python -m scripts.bench_gpu --framework torch --model resnet50 --precision bf16

Prints one ``RESULT {...}`` JSON line (and appends it to ``--json``): the
median of ``--steps`` timed steps after ``--warmup`` untimed ones, each step
waited for (``block_until_ready``, ``torch.cuda.synchronize``), images per
second, the first step's time (compilation), the device and the versions.

The step is the same on both sides: cross-entropy of a batch of random images
with random labels, its gradient, SGD with momentum 0.9 on every parameter
(no weight decay), BatchNorm statistics updated.

* ``jax``: the project's model (``models``) and its fused step
  (``research.steps.jitted.make_fused_step`` with one rank: gradient and update
  one program, the state donated); ``--precision bf16`` computes in bfloat16
  with float32 parameters and updates (``--precision`` of the experiments).
* ``torch``: torchvision's model, ``channels_last``, ``cudnn.benchmark``, TF32
  allowed for convolutions and matrix products (what XLA's default precision
  does on such GPUs), eager; bf16 under ``torch.autocast``.

Run one configuration per process (``scripts.gpu_check`` runs them in turn,
nothing else on the GPU meanwhile). On a machine without a GPU it runs on the
CPU (JAX; torch where installed), which the tests use with a tiny model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from research.entry.cli import doc_parser

#: Our model name -> torchvision's constructor.
TORCHVISION = {"resnet50": "resnet50", "vgg16": "vgg16", "resnet18": "resnet18"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_gpu", __doc__)
    p.add_argument("--framework", choices=("jax", "torch"), required=True)
    p.add_argument("--model", default="resnet50", help="default %(default)s")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--batch", type=int, default=128, help="default %(default)s")
    p.add_argument("--image-size", type=int, default=224, help="default %(default)s")
    p.add_argument("--steps", type=int, default=20, help="timed steps (%(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed (%(default)s)")
    p.add_argument("--json", metavar="PATH", help="append the result line here")
    args = p.parse_args(argv)
    if args.framework == "torch" and args.model not in TORCHVISION:
        p.error(f"--model {args.model}: torchvision has {', '.join(TORCHVISION)}")
    if min(args.batch, args.image_size, args.steps) < 1 or args.warmup < 0:
        p.error("--batch, --image-size and --steps must be positive")
    return args


def _timed(step: Any, sync: Any, steps: int, warmup: int) -> dict[str, float]:
    t0 = time.perf_counter()
    sync(step())
    first = time.perf_counter() - t0
    for _ in range(warmup):
        sync(step())
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - t0)
    return {"first_step_s": first, "ms": statistics.median(times) * 1e3}


def bench_jax(args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import optax

    import models
    from research.steps import jitted as steps
    from research.steps.state import create_train_state
    from research.train.config import PRECISION_DTYPES

    model = models.get_model(
        args.model,
        image_size=args.image_size,
        dtype=PRECISION_DTYPES[args.precision],
    )
    key = jax.random.PRNGKey(1)
    x = jax.random.normal(key, (args.batch, args.image_size, args.image_size, 3))
    y = jax.random.randint(key, (args.batch,), 0, getattr(model, "num_classes", 10))
    state = create_train_state(model, x[:1], optax.sgd(0.01, momentum=0.9), 0)
    step = steps.make_fused_step(lambda g: g)  # one rank: no averaging
    box = {"state": state}

    def one() -> Any:
        box["state"], m = step(box["state"], x, y)
        return m["loss"]

    out = _timed(one, jax.block_until_ready, args.steps, args.warmup)
    dev = jax.local_devices()[0]
    from models.conv import get_weight_grad

    return {
        **out,
        "device": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
        "kernel_gradient": get_weight_grad(),
    }


def bench_torch(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torchvision

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    model = getattr(torchvision.models, TORCHVISION[args.model])()
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=dev)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = args.precision == "bf16"

    def one() -> Any:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    def sync(_: Any) -> None:
        if cuda:
            torch.cuda.synchronize()

    out = _timed(one, sync, args.steps, args.warmup)
    return {
        **out,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "platform": "gpu" if cuda else "cpu",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    bench = bench_jax if args.framework == "jax" else bench_torch
    out = bench(args)
    result = {
        "framework": args.framework,
        "model": args.model,
        "precision": args.precision,
        "batch": args.batch,
        "image_size": args.image_size,
        "steps": args.steps,
        **out,
        "images_per_s": args.batch / (out["ms"] / 1e3),
    }
    print("RESULT", json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
