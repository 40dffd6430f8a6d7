"""benchmarks/outputs_fingerprint.py (the bitwise build-to-build check used for kernel refactors)
on the CPU backend: a saved run compares equal to itself, and a single changed bit is reported."""

import importlib.util
import pathlib

import torch

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "outputs_fingerprint.py"
_spec = importlib.util.spec_from_file_location("outputs_fingerprint", _PATH)
fingerprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fingerprint)


def test_fingerprint_round_trip_and_a_flipped_bit(tmp_path, capsys):
    saved = tmp_path / "base.pt"
    assert fingerprint.main(["--device", "cpu", "--limit", "2", "--save", str(saved)]) == 0
    assert fingerprint.main(["--device", "cpu", "--limit", "2", "--compare", str(saved)]) == 0
    assert "2 of 2 configurations bitwise equal" in capsys.readouterr().out

    outputs = torch.load(saved)
    key = next(iter(outputs))
    o, ht, h = outputs[key]
    ht = ht.clone()
    ht.view(-1)[7] = torch.nextafter(ht.view(-1)[7], torch.tensor(float("inf"), dtype=ht.dtype))
    outputs[key] = (o, ht, h)
    torch.save(outputs, saved)
    assert fingerprint.main(["--device", "cpu", "--limit", "2", "--compare", str(saved)]) == 1
    out = capsys.readouterr().out
    assert f"DIFFERS: {key}: final state" in out and "1 of 2 configurations bitwise equal" in out
