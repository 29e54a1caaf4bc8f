"""`veil codec` verbs through main(argv): encode, decode, truncate, eval, bench, plot, help and errors."""

from __future__ import annotations

import json

import pytest
from veil.codec.cli import build_parser, main
from veil.codec.images import load_image, png_bytes


def run(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_help_shows_an_example(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0 and "veil codec encode photo.png" in capsys.readouterr().out


def test_encode_decode_truncate_eval(capsys, tmp_path, codec_dir, images) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "crop.png").write_bytes(png_bytes(images.crop))
    model = str(codec_dir.parent)  # a model folder: the latest version is used
    enc = run(capsys, "encode", str(tmp_path / "imgs" / "crop.png"), "-o", str(tmp_path / "c.vc"), "--model", model,
              "--scales", "6")
    assert enc["scales"] == 6 and enc["bytes"] == (tmp_path / "c.vc").stat().st_size
    dec = run(capsys, "decode", str(tmp_path / "c.vc"), "-o", str(tmp_path / "c.png"), "--model", model)
    assert dec["height"] == 96 and load_image((tmp_path / "c.png").read_bytes()).shape == images.crop.shape
    cut = run(capsys, "truncate", str(tmp_path / "c.vc"), "--scales", "3", "-o", str(tmp_path / "c3.vc"))
    assert cut["bytes"] < enc["bytes"]
    ev = run(capsys, "eval", str(tmp_path / "imgs"), "--model", model, "--target-bpp", "0.05", "--per-image")
    assert ev["mean"]["bpp"] <= 0.05 and ev["images"][0]["image"] == "crop.png"
    assert {"psnr", "ms_ssim", "encoding_time", "decoding_time"} <= set(ev["mean"])


def test_bench_and_plot(capsys, tmp_path, codec_dir, images) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "crop.png").write_bytes(png_bytes(images.crop))
    out = run(capsys, "bench", str(tmp_path / "imgs"), "--model", str(codec_dir), "--targets", "0.2",
              "--codecs", "webp", "-o", str(tmp_path / "b.json"))
    row = out["rows"][0]
    assert row["veil"]["mean"]["bpp"] <= 0.2 and len(out["curve"]) == 10
    assert row["webp"]["mean"] is None or row["webp"]["mean"]["bpp"] <= 0.2
    plotted = run(capsys, "plot", str(tmp_path / "b.json"), "-o", str(tmp_path / "rd.png"))
    assert plotted["output"].endswith("rd.png") and (tmp_path / "rd.png").stat().st_size > 5_000


def test_errors_exit_2_with_the_reason(capsys, tmp_path, codec_dir) -> None:
    (tmp_path / "junk.vc").write_bytes(b"junk bytes")
    assert main(["decode", str(tmp_path / "junk.vc"), "-o", str(tmp_path / "x.png"), "--model", str(codec_dir)]) == 2
    assert "bitstream magic" in capsys.readouterr().err
    assert main(["encode", str(tmp_path / "junk.vc"), "-o", str(tmp_path / "x.vc"), "--model", str(codec_dir)]) == 2
    assert "image format" in capsys.readouterr().err
    assert main(["encode", str(tmp_path / "junk.vc"), "-o", str(tmp_path / "x.vc"), "--model", str(tmp_path)]) == 2
    assert "expected an exported codec" in capsys.readouterr().err


def test_corrupt_streams_and_limits_are_one_line_errors_exit_2(capsys, tmp_path, codec_dir, images) -> None:
    """Issue 19, item 15: a resealed corrupt stream and a size beyond --max-pixels exit 2 with one line."""
    import zlib

    from veil.codec.runtime import CodecRuntime

    data = bytearray(CodecRuntime(codec_dir).encode(images.crop, k=5).data)
    data[7] ^= 0x80  # height 96 -> 32864
    body = bytes(data[:-4])
    (tmp_path / "bad.vc").write_bytes(body + zlib.crc32(body).to_bytes(4, "big"))
    assert main(["decode", str(tmp_path / "bad.vc"), "-o", str(tmp_path / "x.png"), "--model", str(codec_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil codec decode: bitstream ") and err.count("\n") == 1 and "Traceback" not in err
    png = tmp_path / "crop.png"
    from veil.codec.images import png_bytes

    png.write_bytes(png_bytes(images.crop))
    assert main(["encode", str(png), "-o", str(tmp_path / "c.vc"), "--model", str(codec_dir),
                 "--max-pixels", "10000"]) == 2
    assert "at most 10000 pixels" in capsys.readouterr().err


def test_encode_without_a_model_says_how_to_get_one(capsys, tmp_path) -> None:
    assert main(["encode", "photo.png", "-o", str(tmp_path / "x.vc"), "--model", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"veil train codec --out {tmp_path / 'none'}" in err and "veil export codec CHECKPOINT" in err
    assert "15 minutes" in err and "--quick" in err
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"")
    assert main(["encode", "photo.png", "-o", str(tmp_path / "x.vc"), "--model", str(tmp_path / "ck")]) == 2
    assert f"veil export codec {tmp_path / 'ck'} --repo" in capsys.readouterr().err


def test_without_model_or_shipped_default_the_error_says_how_to_get_one(capsys, tmp_path, monkeypatch) -> None:
    import veil.codec.cli as cli

    monkeypatch.setattr(cli, "SHIPPED_MODEL", tmp_path / "not-installed")
    assert main(["encode", "photo.png", "-o", str(tmp_path / "x.vc")]) == 2
    err = capsys.readouterr().err
    assert "--model: not given, and the default model shipped with veil" in err and "not-installed" in err
    assert "veil train codec --out runs/codec" in err and "15 minutes" in err
    assert "veil train codec --quick --out runs/codec-quick" in err and "under a minute" in err


def test_an_explicit_model_wins_and_is_named(capsys, tmp_path, codec_dir, images) -> None:
    (tmp_path / "crop.png").write_bytes(png_bytes(images.crop))
    enc = run(capsys, "encode", str(tmp_path / "crop.png"), "-o", str(tmp_path / "c.vc"), "--model", str(codec_dir))
    assert enc["model"]["source"] == "--model" and enc["model"]["path"] == str(codec_dir)


def test_the_coding_memory_budget_is_a_flag(capsys, tmp_path, codec_dir, images) -> None:
    """A photo over --max-work-mb is one line naming the size and the budget; raising the flag codes it."""
    (tmp_path / "crop.png").write_bytes(png_bytes(images.crop))
    args = ["encode", str(tmp_path / "crop.png"), "-o", str(tmp_path / "c.vc"), "--model", str(codec_dir)]
    assert main([*args, "--max-work-mb", "0.01"]) == 2
    assert "expected at most 0.01 MiB" in capsys.readouterr().err
    assert main([*args, "--max-work-mb", "4096"]) == 0 and (tmp_path / "c.vc").is_file()
