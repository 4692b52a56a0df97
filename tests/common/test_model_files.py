"""common/model_files.py: a model folder's files checked from their headers, each problem one line, nothing
unpickled, nothing read past a header, no special file opened (issue 31)."""

import json
import os
import struct
import time

import pytest

from common.model_files import adapter_folder_problem, model_folder_problem, safetensors_shapes, shape_problem


def safetensors_bytes(header, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: the 8-byte header length (`length` to lie about it), the header, the data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


TENSOR = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def test_a_whole_file_gives_its_shapes_and_the_fixture_models_pass(real_model_dirs, tmp_path):
    (tmp_path / "x.safetensors").write_bytes(safetensors_bytes(TENSOR, bytes(16)))
    assert safetensors_shapes(tmp_path / "x.safetensors") == {"w": (2, 2)}
    for directory in real_model_dirs.values():
        assert model_folder_problem(directory) is None and shape_problem(directory) is None


@pytest.mark.parametrize("content, expected", [
    (b"", "is 0 bytes, shorter than a safetensors header: the file is truncated"),
    (safetensors_bytes(TENSOR, bytes(8)), "the file is truncated"),
    (safetensors_bytes(TENSOR, bytes(24)), "has 8 bytes after its last tensor"),
    (safetensors_bytes(TENSOR, length=1 << 63), "declares a 9,223,372,036,854,775,808-byte header"),
    (safetensors_bytes(TENSOR, length=10_000), "its header alone needs 10,008: the file is truncated"),
    (safetensors_bytes(b"[" * 100_000 + b"]" * 100_000), "has a header that is not safetensors JSON"),
    (safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'),
     "has a header that is not safetensors JSON"),
    (safetensors_bytes(b"\xff\xfe not utf-8"), "has a header that is not safetensors JSON"),
    (safetensors_bytes([1, 2, 3]), "has a header that is not a JSON object"),
    (safetensors_bytes({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 16]}}, bytes(16)),
     "malformed header entry for 'w'"),
    (safetensors_bytes({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}}, bytes(16)),
     "malformed header entry for 'w'"),
    (safetensors_bytes({"w": "not an entry"}), "malformed header entry for 'w'"),
])
def test_a_damaged_file_is_named_in_words(tmp_path, content, expected):
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        safetensors_shapes(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def copy_of(good, target):
    import shutil

    shutil.copytree(good, target)
    return target


def test_a_device_or_a_broken_link_among_the_files_is_refused_unread(real_model_dirs, tmp_path):
    directory = copy_of(real_model_dirs["qwen2"], tmp_path / "zero")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to("/dev/zero")  # stat size 0, and it never ends
    started = time.monotonic()
    problem = model_folder_problem(directory)
    assert "model.safetensors is a character device" in problem and time.monotonic() - started < 5
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to(tmp_path / "gone")
    assert "model.safetensors cannot be read: no such file" in model_folder_problem(directory)


def test_a_shard_index_names_only_files_of_the_folder(real_model_dirs, tmp_path):
    directory = copy_of(real_model_dirs["qwen2"], tmp_path / "sharded")
    index = directory / "model.safetensors.index.json"
    for shard, expected in (("../../etc/passwd", "not a file of the folder"),
                            ("model-00002-of-00002.safetensors", "which is not there; copy the missing shard")):
        index.write_text(json.dumps({"weight_map": {"w": "model.safetensors", "v": shard}}))
        assert expected in model_folder_problem(directory)
    index.write_text("[" * 50_000)
    assert "model.safetensors.index.json is not a shard index" in model_folder_problem(directory)
    index.write_text(json.dumps({"weight_map": {"w": "model.safetensors"}}))
    assert model_folder_problem(directory) is None


def test_pickle_weights_are_refused_and_a_folder_without_weights_may_wait_for_its_loader(real_model_dirs, tmp_path):
    directory = copy_of(real_model_dirs["qwen2"], tmp_path / "pt")
    (directory / "model.safetensors").rename(directory / "model.pt")
    assert "its weights are pickle files (model.pt), which marl never loads" in model_folder_problem(directory)
    (directory / "model.pt").unlink()
    assert "no weights (no *.safetensors file)" in model_folder_problem(directory)
    assert model_folder_problem(directory, require_weights=False) is None  # the memory check runs first
    (directory / "training_args.bin").write_bytes(b"a Trainer's settings: never loaded, never refused")
    assert "no weights" in model_folder_problem(directory)


def test_an_adapter_folder_is_checked_the_same_way(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.bin").write_bytes(b"pickle")
    assert "its weights are pickle files (adapter_model.bin)" in adapter_folder_problem(adapter)
    (adapter / "adapter_model.safetensors").write_bytes(safetensors_bytes(TENSOR, bytes(4)))
    assert "adapter_model.safetensors is " in adapter_folder_problem(adapter)
    (adapter / "adapter_model.safetensors").write_bytes(safetensors_bytes(TENSOR, bytes(16)))
    assert adapter_folder_problem(adapter) is None
    os.mkfifo(adapter / "marl_base.json")
    assert "marl_base.json is a named pipe (FIFO)" in adapter_folder_problem(adapter)


def test_a_config_describing_a_huge_model_is_compared_without_allocating_it(real_model_dirs, tmp_path):
    """hidden_size 2^20 would be terabytes of weights: built on the meta device, only its shapes are read."""
    directory = copy_of(real_model_dirs["qwen2"], tmp_path / "huge")
    config = json.loads((directory / "config.json").read_text())
    config.update(hidden_size=1 << 20, intermediate_size=1 << 21)
    (directory / "config.json").write_text(json.dumps(config))
    problem = shape_problem(directory)
    assert "config.json does not match the weights: " in problem and f"{1 << 20}]" in problem


def test_a_config_declaring_a_million_layers_is_refused_from_the_names_alone(real_model_dirs, tmp_path):
    """Building a million layers, even on the meta device, takes minutes: the weights' layer names decide first."""
    for architecture, key in (("llama", "num_hidden_layers"), ("gpt2", "n_layer")):
        directory = copy_of(real_model_dirs[architecture], tmp_path / architecture)
        config = json.loads((directory / "config.json").read_text())
        config[key] = 1_000_000
        config.pop("layer_types", None)
        (directory / "config.json").write_text(json.dumps(config))
        started = time.monotonic()
        assert "it declares 1,000,000 layers (num_hidden_layers) but the weights hold 2" in shape_problem(directory)
        assert time.monotonic() - started < 10


def test_a_metadata_file_too_large_to_be_one_is_refused_unread(real_model_dirs, tmp_path):
    directory = copy_of(real_model_dirs["qwen2"], tmp_path / "big")
    with open(directory / "config.json", "r+b") as handle:  # sparse: 300 MB of nothing, no disk used
        handle.truncate(300 << 20)
    assert "config.json is 314,572,800 bytes, over the 268,435,456" in model_folder_problem(directory)
