"""A command's overlay layer is made while another command's layer of the same checkout is
removed (``infra.exec.sandbox.overlay``): the removal takes the directory of layers away when
it leaves it empty, between the new layer's ``mkdir`` of that directory and its own. Under
load this answered one ``exec`` in a thousand with ``INTERNAL: FileNotFoundError``
(``tests/system/test_load.py``'s long run); the removal is made to land exactly there."""

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
    assert not other.exists()
