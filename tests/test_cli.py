import pytest

from mechfact.cli import build_parser, main

BAD = [
    (["memory", "sweep", "--d", "0", "--out", "{o}"], "--d 0"),
    (["memory", "sweep", "--d", "-3", "--out", "{o}"], "--d -3"),
    (["memory", "sweep", "--kappa", "1.5", "--out", "{o}"], "--kappa 1.5"),
    (["memory", "sweep", "--kappa", "0", "--out", "{o}"], "--kappa 0"),
    (["memory", "sweep", "--alpha-min", "1.0", "--alpha-max", "0.5", "--out", "{o}"], "--alpha-min 1.0"),
    (["memory", "sweep", "--seeds", "0", "--out", "{o}"], "--seeds 0"),
    (["memory", "capacity", "--method", "magic", "--out", "{o}"], "--method"),
    (["memory", "capacity", "--problem", "shared", "--out", "{o}"], "--problem"),
    (["memory", "capacity", "--method", "separable", "--kappa", "0.5", "--out", "{o}"], "--kappa 0.5"),
    (["memory", "scores", "--d", "0", "--out", "{o}"], "--d 0"),
    (["memory", "spectrum", "--seeds", "0", "--out", "{o}"], "--seeds 0"),
    (["memory", "sweep", "--device", "tpu", "--out", "{o}"], "--device"),
    (["memory", "sweep", "--steps", "0", "--out", "{o}"], "--steps 0"),
    (["memory", "sweep", "--d", "abc", "--out", "{o}"], "--d"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_exits_2_with_one_line(argv, needle, tmp_path, capsys):
    argv = [a.replace("{o}", str(tmp_path / "o")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert needle in err and "Traceback" not in err


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["memory", "sweep", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "not a writable directory" in err


def _all_commands(parser, prefix=()):
    """Every command path of the parser tree, e.g. ("memory", "sweep"), ("facts", "train")."""
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix
        return
    yield prefix
    for name, p in subs[0].choices.items():
        yield from _all_commands(p, prefix + (name,))


def test_help_on_every_subcommand(capsys):
    paths = list(_all_commands(build_parser()))
    assert {("memory", "sweep"), ("facts", "train"), ("facts", "capacity"), ("quickstart",)} <= set(paths)
    for path in paths:
        assert main(list(path) + ["--help"]) == 0, path
        assert "usage:" in capsys.readouterr().out


def test_parser_defaults_match_issue_contract():
    a = build_parser().parse_args(["memory", "sweep", "--d", "32", "64", "--alpha-min", "0.05", "--alpha-max", "1.2",
                                   "--points", "12", "--seeds", "3", "--method", "trained", "--problem", "original",
                                   "--kappa", "1.0", "--out", "x"])
    assert (a.d, a.points, a.seeds, a.method, a.problem, a.kappa, a.device) == ([32, 64], 12, 3, "trained", "original", 1.0, "auto")


def test_cli_sweep_end_to_end(tmp_path):
    out = tmp_path / "s"
    assert main(["memory", "sweep", "--d", "8", "--points", "2", "--seeds", "1", "--method", "hebb",
                 "--alpha-max", "0.5", "--out", str(out), "--quiet"]) == 0
    assert (out / "result.json").exists() and (out / "fig_accuracy.png").exists()
