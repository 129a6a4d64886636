"""``colibri convert``: an HF checkpoint -> a colibri container with quantized routed experts."""

from __future__ import annotations

import argparse
import json
import sys

EXPERT_CHOICES = ("int8", "int4", "int4g64", "int4g128", "int3", "int2", "e8", "fp8")
DENSE_CHOICES = ("f32", *EXPERT_CHOICES)
#: colibri's converter calls this ``--io-bits`` (default 8); ours defaults to f32 so the
#: committed fixture containers regenerate byte for byte (spec/DEVIATIONS.md).
IO_CHOICES = ("f32", "int8")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="write a colibri container (quantized routed experts) from an HF checkpoint",
        description=(
            "Convert an HF checkpoint (F32/BF16/F16, or HF FP8 with weight_scale_inv) into a "
            "colibri container: routed experts in the --experts format, other linear weights "
            "in the --dense format, the embedding and lm_head in the --io format (norms and the "
            "router stay f32)."
        ),
    )
    parser.add_argument("--model", required=True, help="input HF model directory")
    parser.add_argument("--out", required=True, help="output directory (absent or empty)")
    parser.add_argument("--experts", required=True, choices=EXPERT_CHOICES)
    parser.add_argument("--dense", default="f32", choices=DENSE_CHOICES)
    parser.add_argument(
        "--io",
        default="f32",
        choices=IO_CHOICES,
        help="format of the embedding and the lm_head (default f32; int8 is int8-row, "
        "like colibri's --io-bits 8)",
    )
    parser.add_argument(
        "--shard-mb", type=int, default=4096, help="largest output shard in MB (default 4096)"
    )
    parser.add_argument(
        "--layout",
        default="hf",
        choices=("hf", "colibri"),
        help="file naming: hf (model.safetensors / model-NNNNN-of-NNNNN) or colibri "
        "(out-NNNNN, out-idx-NNNNN for the DSA indexer, out-mtp-NNNNN for the MTP layer, "
        "as colibri's converters write them)",
    )
    parser.add_argument(
        "--indexer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the DSA indexer (default); --no-indexer leaves it out as colibri's "
        "converter does without --indexer, and the engines then run with it off",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from colibri.commands.progress import byte_progress
    from colibri.reference.quant.convert import ConvertError, convert
    from colibri.reference.quant.errors import QuantFormatError
    from colibri.reference.quant.safetensors_file import ContainerError

    if args.shard_mb <= 0:
        print("colibri convert: --shard-mb must be positive", file=sys.stderr)
        return 2
    advance, close = byte_progress("convert")
    try:
        report = convert(
            args.model,
            args.out,
            args.experts,
            args.dense,
            io=args.io,
            shard_bytes=args.shard_mb << 20,
            layout=args.layout,
            indexer=args.indexer,
            progress=advance,
        )
    except (ConvertError, QuantFormatError, ContainerError, FileNotFoundError) as exc:
        close()
        print(f"colibri convert: {exc}", file=sys.stderr)
        return 1
    close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        ratio = report.output_bytes / max(report.input_bytes, 1)
        formats = ", ".join(f"{n} {f}" for f, n in sorted(report.formats.items()))
        print(
            f"wrote {args.out}: {report.tensors} tensors ({formats}); "
            f"{report.input_bytes / 1e6:.1f} MB -> {report.output_bytes / 1e6:.1f} MB "
            f"({ratio:.2f}x)"
        )
    return 0
