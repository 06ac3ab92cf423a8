"""A command's overlay layer is made while another command's layer of the same checkout is
removed (``infra.exec.sandbox.overlay``): the removal took the directory of layers away when
it left it empty, between the new layer's ``mkdir`` of that directory and its own, or inside
``Path.mkdir``'s own check. Under load this answered one ``exec`` in a thousand with
``INTERNAL: FileNotFoundError``, then ``FileExistsError`` (``tests/system/test_load.py``'s long
run). A removal leaves the directory now (the checkout's eviction takes it), and a make whose
directory went away meanwhile tries again: each race is made to land exactly there."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.exec.sandbox import overlay


def test_a_layer_is_made_while_another_is_removed_with_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkouts = tmp_path / "checkouts"
    tree = checkouts / "acme" / "ws" / "tree"
    tree.mkdir(parents=True)
    other = overlay.make(checkouts, tree, None)  # a command's layer, about to be removed
    names = iter(["first", "second", "third"])
    raced = []

    def token_hex(_: int) -> str:  # called between the two mkdirs: the removal lands there
        if not raced:
            overlay.remove(other)  # the last layer: its directory of layers goes with it
            raced.append(True)
        return next(names)

    monkeypatch.setattr(overlay.secrets, "token_hex", token_hex)
    layer = overlay.make(checkouts, tree, None)
    assert raced and layer.is_dir() and (layer / overlay.UPPER).is_dir()
    assert not other.exists() and other.parent.is_dir()


def test_a_layer_is_made_when_its_directory_goes_inside_mkdirs_own_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Path.mkdir(exist_ok=True)`` met ``EEXIST``, then found no directory there (removed
    between the two): ``FileExistsError``, which ``make`` takes as "try again"."""
    checkouts = tmp_path / "checkouts"
    tree = checkouts / "acme" / "ws" / "tree"
    tree.mkdir(parents=True)
    layers = overlay.layer_dir(checkouts, tree.parent)
    layers.mkdir(parents=True)
    real = Path.is_dir
    gone = []

    def is_dir(self: Path) -> bool:
        if self == layers and not gone:
            gone.append(True)
            return False  # as if removed between mkdir's EEXIST and this check
        return real(self)

    monkeypatch.setattr(Path, "is_dir", is_dir)
    layer = overlay.make(checkouts, tree, None)
    assert gone and layer.parent == layers and (layer / overlay.UPPER).is_dir()
