import re


from mechfact.cli import main


def test_quickstart_fast_renders_every_section_with_numbers(tmp_path, capsys):
    out = tmp_path / "qs"
    assert main(["quickstart", "--fast", "--out", str(out), "--quiet"]) == 0
    assert str(out / "report.html") in capsys.readouterr().out
    html = (out / "report.html").read_text()
    for title in ("perfect-recall capacity", "where the target scores sit", "Spectra of W", "Environment"):
        assert title in html
    assert html.count("data:image/png;base64,") >= 4  # figures embedded, self-contained
    # tables carry real numbers, not placeholders
    cells = re.findall(r"<td>(-?\d+\.\d+(?:e-?\d+)?)</td>", html)
    assert len(cells) > 20
