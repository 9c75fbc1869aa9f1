from __future__ import annotations

import pytest

from speckv.services import cli


def test_no_command_prints_usage(capsys):
    assert cli.main([], {}) == 2
    out = capsys.readouterr().out
    for command in (*cli.SERVICES, *cli.TOOLS):
        assert command in out


def test_unknown_command_is_an_error(capsys):
    assert cli.main(["frobnicate"], {}) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [*cli.SERVICES, *cli.TOOLS])
def test_every_command_has_help(command, capsys):
    try:
        code = cli.main([command, "--help"], {})
    except SystemExit as exited:  # argparse exits after printing help
        code = exited.code
    assert code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_bad_configuration_is_reported_not_raised(capsys):
    assert cli.main(["up", "--nodes", "0"], {}) == 2
    assert "--nodes=0" in capsys.readouterr().err
