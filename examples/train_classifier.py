"""Train a small convolutional network through ImageLoader: a real PyTorch training loop.

    python examples/train_classifier.py                  # generated dataset, CPU or GPU
    python examples/train_classifier.py --data /path/to/imagefolder --epochs 5
    python examples/train_classifier.py --augment     # + a per-sample augmentation

Prints loss, training accuracy (on the epoch's augmented batches: there is no held-out
set here), throughput and the data-stall fraction per epoch. Without --data it
trains on a generated folder (each class has its own colour cast, so there is something to
learn); on a 2-core CPU the default run takes about 10-25 seconds (more when the machine is
shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import gpu_loader as gl


class SmallNet(nn.Module):
    """Four strided conv blocks and a linear head: small enough for a CPU."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

        self.features = nn.Sequential(block(3, 16), block(16, 32), block(32, 64), block(64, 64))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="ImageFolder (default: generated)")
    parser.add_argument("--num-images", type=int, default=800, help="generated dataset size")
    parser.add_argument("--classes", type=int, default=4, help="generated dataset classes")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=96, help="training resolution")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batching", choices=("ordered", "straggler"), default="ordered")
    parser.add_argument(
        "--decode-on",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="auto: the GPU decode path on CUDA (the CPU one with --augment); cpu: decode "
        "on the CPU and copy batches to the device (the faster on the one H100 measured)",
    )
    parser.add_argument(
        "--augment",
        action="store_true",
        help="random brightness and contrast per sample (ImageLoader(augment=...))",
    )
    args = parser.parse_args(argv)
    for name in ("num_images", "classes", "epochs", "batch_size", "size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        # Before the dataset is generated, which takes a while.
        parser.error(f"--device {args.device}, but no CUDA device is usable here")
    if args.decode_on == "gpu" and args.augment:
        parser.error("--augment runs on the CPU decode path: leave --decode-on at auto or cpu")
    on_cuda = args.device.startswith("cuda") or (
        args.device == "auto" and torch.cuda.is_available()
    )
    if args.decode_on == "gpu" and not on_cuda:
        parser.error(f"--decode-on gpu needs a CUDA device (--device {args.device})")
    return args


def brightness_contrast(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A per-sample augmentation for `ImageLoader(augment=...)`: ``image`` is the crop as
    a [3, H, W] uint8 tensor; the draws come from the sample's own generator, so the run
    is reproducible whatever the loader's threads do. Returns 0-1 floats; the loader
    normalises them. (torchvision's ColorJitter would do here too, drawing from torch's
    global generator instead.)"""
    brightness, contrast = (0.75 + 0.5 * torch.rand(2, generator=generator)).tolist()
    x = image.float().div_(255)
    mean = x.mean()
    return ((x - mean) * contrast + mean * brightness).clamp_(0, 1)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Train; return one record per epoch (loss, accuracy, img/s, stall)."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.data is None:
        from gpu_loader.cli import CliError, cached_dataset

        try:
            args.data = cached_dataset(
                f"train-example-{args.num_images}-{args.classes}",
                "example",
                num_images=args.num_images,
                num_classes=args.classes,
                seed=args.seed,
                min_side=96,
                max_side=320,
            )
        except CliError as exc:
            raise SystemExit(str(exc)) from None
    try:
        source = gl.sources.ImageFolder(args.data)
        loader = gl.ImageLoader(
            source,
            batch_size=args.batch_size,
            transform=gl.ops.TrainTransform(args.size, scale=(0.25, 1.0)),
            device=args.device,
            seed=args.seed,
            batching=args.batching,
            augment=brightness_contrast if args.augment else None,
            options=gl.LoaderOptions(decode_on=args.decode_on),
        )
    except (OSError, ValueError, RuntimeError) as exc:  # a bad --data or --device: one line
        raise SystemExit(f"train_classifier.py: error: {exc}") from None
    print(
        f"data: {args.data} ({len(source)} images, {len(source.classes)} classes); "
        f"device: {loader.device}; decode on: "
        f"{'gpu' if loader.decodes_on_gpu else 'cpu'}; batching: {args.batching}"
        + ("; augment: brightness, contrast" if args.augment else ""),
        flush=True,
    )
    model = SmallNet(len(source.classes)).to(loader.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    history = []
    before: gl.monitor.LoaderStats | None = None
    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            model.train()
            total_loss = correct = seen = 0.0
            start = time.perf_counter()
            for images, labels in loader:
                logits = model(images.float())
                loss = loss_fn(logits, labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total_loss += loss.item() * len(labels)
                correct += (logits.argmax(1) == labels).sum().item()
                seen += len(labels)
            stats = loader.stats()
            # This epoch's stall: the waiting and the time it added (the first epoch's
            # figures already leave out the wait for the very first batch).
            if before is None:
                stall = stats.stall_fraction
            else:
                spent = stats.elapsed_s - before.elapsed_s
                stall = (stats.stall_s - before.stall_s) / spent if spent > 0 else 0.0
            before = stats
            record = {
                "epoch": epoch,
                "loss": total_loss / seen,
                "accuracy": correct / seen,
                "img_per_s": seen / (time.perf_counter() - start),
                "stall_percent": 100 * stall,
            }
            history.append(record)
            print(
                f"epoch {epoch}: loss {record['loss']:.3f}  "
                f"train accuracy {record['accuracy']:.1%}  "
                f"{record['img_per_s']:.0f} img/s  data stall {record['stall_percent']:.1f}%",
                flush=True,
            )
    return history


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
