"""benchmarks/codec_rd.py runs end to end in its smoke setting and writes only its own results section."""

from __future__ import annotations

import json


def test_codec_rd_benchmark_smoke(load_benchmark, tmp_path, codec_dir) -> None:
    module = load_benchmark("codec_rd")
    (tmp_path / "results.md").write_text("# results\n\n<!-- other:begin -->\nkept text\n<!-- other:end -->\n")
    assert module.main(["--quick", "--model", str(codec_dir), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert "kept text" in text and text.count("<!-- codec_rd:begin -->") == 1 and "| 0.1 |" in text
    report = json.loads((tmp_path / "results" / "codec_rd.json").read_text())
    assert report["bpp_strictly_increasing"] and report["determinism"]["bit_exact"]
    assert len(report["curve"]) == 10 and report["rows"][0]["veil"]["mean"]["bpp"] <= 0.1
    assert (tmp_path / "img" / "codec_rd.png").stat().st_size > 10_000
