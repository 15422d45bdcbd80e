"""A fused file on the GPU (`pyq2 repack --fuse`): pyq2.runtime.load.load keeps each fused tensor as
one device matrix, and pyq2.runtime.step.DecodeStep runs it as it is, with no copy of its own,
giving the same bits as the unfused file (whose siblings the step concatenates at run time); every
member still answers by its own name."""

import pytest

from ..conftest import gpu_module, settled_allocated

torch = gpu_module()

from pyq2.errors import FormatError  # noqa: E402
from pyq2.offline.demo import write_demo_model  # noqa: E402
from pyq2.offline.repack import repack  # noqa: E402
from pyq2.runtime.load import load  # noqa: E402
from pyq2.runtime.step import DecodeStep, concat_rows  # noqa: E402
from pyq2.runtime.timing import fill_random_mixers  # noqa: E402

from ..offline.test_fuse import ATTN, BAD, with_keys  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fused")
    demo = write_demo_model(d / "demo.gguf")
    fused = repack(demo, d / "fused.gguf", fuse=True).out_path
    return demo, fused


def run_step(model, m, fuse):
    step = DecodeStep(model, m, dtype=torch.float32, fuse=fuse)
    fill_random_mixers(step, m)
    step.ids.copy_(torch.arange(m, dtype=torch.int32) * 37 % 1024)
    step.run()
    torch.cuda.synchronize()
    return step


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_fused_file_steps_like_the_unfused(files, m, fuse):
    demo, fused = files
    plain, model = load(demo), load(fused)
    a, b = run_step(plain, m, fuse), run_step(model, m, fuse)
    assert a.outputs.keys() == b.outputs.keys()
    for name, out in a.outputs.items():
        assert torch.equal(out, b.outputs[name]), name


def test_fused_step_runs_the_files_matrix_without_a_copy(files):
    demo, fused = files
    plain, model = load(demo), load(fused)
    assert len(model.fused) == 4
    before = settled_allocated()
    step = DecodeStep(model, 1)
    after = torch.cuda.memory_allocated()
    plain_step = DecodeStep(plain, 1)
    plain_after = torch.cuda.memory_allocated()
    for i, stage in enumerate(model.plan.stages):
        f = model.fused_for(stage.projections)
        if f is not None:
            ((w, _),) = step.matmuls[i]
            assert w is f.weight.matrix
    assert all(w.stored is None for w in model.weights.values() if w.part is not None)
    # the unfused file's step holds a concatenated copy of every group; the fused one none
    copies = sum(f.weight.matrix.data.numel() for f in model.fused.values())
    assert (plain_after - after) - (after - before) >= copies
    assert plain_step.matmuls.keys() == step.matmuls.keys()


def test_members_answer_by_name(files):
    demo, fused = files
    plain, model = load(demo), load(fused)
    for name, w in model.weights.items():
        ref = plain.weights[name]
        assert w.shape == ref.shape and (w.source, w.rotation_width) == (
            ref.source,
            ref.rotation_width,
        )
        assert torch.equal(w.matrix.data, ref.matrix.data), name  # a member: copied out now
    for f in model.fused.values():
        members = [plain.weights[m.name].matrix for m in f.members]
        assert torch.equal(f.weight.matrix.data, concat_rows(members).data)


@pytest.mark.parametrize("layout,rt", [("planes", 0), ("tiles", 1), ("tiles", 4)])
def test_fused_file_into_other_layouts(files, layout, rt):
    demo, fused = files
    plain, model = load(demo, layout=layout, rt=rt), load(fused, layout=layout, rt=rt)
    assert len(model.fused) == 4  # the demo's members are whole tiles of every height
    for name in ATTN:
        assert torch.equal(model.weights[name].matrix.data, plain.weights[name].matrix.data)
    if layout == "tiles":
        a, b = run_step(plain, 4, True), run_step(model, 4, True)
        for name, out in a.outputs.items():
            assert torch.equal(out, b.outputs[name]), name


@pytest.mark.parametrize("case", ["offsets", "also-unfused", "position-twice"])
def test_load_refuses_bad_fused_metadata_before_keeping_gpu_memory(files, tmp_path, case):
    _, fused = files
    changes, message = BAD[case]
    bad = with_keys(fused, tmp_path / "bad.gguf", changes)
    before = settled_allocated()
    torch.cuda.reset_peak_memory_stats()
    with pytest.raises(FormatError) as e:
        load(bad)
    assert message in str(e.value)
    # refused before allocating: nothing kept, and nothing allocated and freed on the way
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() == before
