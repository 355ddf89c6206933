"""make wheelhouse (tools/wheelhouse.py, issue 22): which wheels an offline GPU machine that has
its own torch needs. The resolution runs on a fake index (no network); the slow tests download
for real, install offline into a fresh environment and run notebook 00 and collect tests/gpu."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "tools" / "wheelhouse.py")
wh = importlib.util.module_from_spec(_spec)
sys.modules["wheelhouse"] = wh  # dataclasses look their module up there
_spec.loader.exec_module(wh)

IMAGE = ROOT / "tools" / "images" / "workplace-cuda-2026-11.txt"


class FakeIndex:
    """name -> {version: requires}; picks the pin, else the newest version the spec admits."""

    def __init__(self, packages):
        self.packages, self.asked = packages, []

    def __call__(self, name, spec, pin):
        self.asked.append((name, str(spec), pin))
        versions = self.packages[name]
        version = pin if pin is not None else max(
            (v for v in versions if spec.contains(v, prereleases=True)),
            key=lambda v: tuple(int(x) for x in v.split(".")))
        return wh.Wheel(name, version, f"{name}-{version}-py3-none-any.whl", 1000,
                        list(versions[version]))


def test_carries_only_what_the_target_lacks_and_follows_only_those():
    index = FakeIndex({
        "diffusers": {"0.42.1": ["importlib_metadata", "huggingface-hub<3.0,>=1.32.0",
                                 "safetensors>=0.8.0", "torch>=2.0 ; extra == 'torch'"]},
        "importlib-metadata": {"10.2.0": ["zipp>=3.20", "lazy-importer>=0.1; python_version < '3.15'"],
                               "8.0.0": ["zipp>=3.20"]},
        "lazy-importer": {"0.1.0": []},
        "torchao": {"0.18.0": []},
    })
    have = {"torch": "2.11.0+cu130", "huggingface-hub": "1.33.0", "safetensors": "0.8.0",
            "zipp": None}
    wheels = wh.resolve(["diffusers>=0.42", "torchao>=0.18", "torch>=2.11"], have, index, "3.12",
                        pinned={"diffusers": "0.42.1", "torchao": "0.18.0"})
    assert [(w.name, w.version, w.needed_by) for w in wheels] == [
        ("diffusers", "0.42.1", "fastdiff"), ("torchao", "0.18.0", "fastdiff"),
        ("importlib-metadata", "10.2.0", "diffusers"), ("lazy-importer", "0.1.0",
                                                        "importlib-metadata")]
    # the extra's torch requirement and the target's own packages were never asked for
    assert [a[0] for a in index.asked] == ["diffusers", "torchao", "importlib-metadata",
                                           "lazy-importer"]
    # markers are the target's: on Python 3.15 lazy-importer is not needed
    index.asked.clear()
    wheels = wh.resolve(["diffusers"], have, index, "3.15", pinned={"diffusers": "0.42.1"})
    assert "lazy-importer" not in [w.name for w in wheels]


def test_never_carries_torch_and_refuses_what_only_the_machine_can_fix():
    index = FakeIndex({"accelerate": {"1.15.0": ["torch>=2.0.0", "numpy"]},
                       "numpy": {"2.4.6": []}})
    with pytest.raises(wh.Refusal, match="torch is not on the target.*never carries torch"):
        wh.resolve(["accelerate"], {}, index, "3.12")
    with pytest.raises(wh.Refusal, match="torch 1.13.1 on the target does not satisfy torch>=2.0.0"):
        wh.resolve(["accelerate"], {"torch": "1.13.1"}, index, "3.12")
    upgraded = wh.resolve(["numpy>=2.4"], {"numpy": "1.26.4"}, index, "3.12")
    assert upgraded[0].replaces == "1.26.4"  # an older non-core package is replaced, and said
    conflict = FakeIndex({"a": {"1.0": ["c<2"]}, "b": {"1.0": ["c>=2"]}, "c": {"1.5": [], "2.1": []}})
    with pytest.raises(wh.Refusal, match="c: 1.5 was chosen for a, but b needs c>=2"):
        wh.resolve(["a", "b"], {}, conflict, "3.12")


def test_a_target_below_the_floor_is_refused_with_the_reason():
    requirements, requires_python = wh.project_requirements()
    wh.check_floor({"torch": "2.11.0+cu130", "transformers": "5.17.0", "huggingface-hub": "1.33.0"},
                   "3.12", requirements, requires_python)
    with pytest.raises(wh.Refusal) as info:
        wh.check_floor({"torch": "2.10.0+cu128", "transformers": "4.57.0"}, "3.9",
                       requirements, requires_python)
    message = str(info.value)
    assert "Python 3.9 is outside fastdiff's range >=3.10,<3.14" in message
    assert "torch 2.10.0+cu128 on the target does not satisfy torch>=2.11" in message
    assert "transformers 4.57.0 on the target does not satisfy transformers<6,>=5.17" in message


def test_have_reads_pip_freeze_and_lists():
    freeze = ("torch==2.11.0+cu130\nTransformers==5.17.0\n-e git+https://x/y.git#egg=z\n"
              "mypkg @ file:///tmp/mypkg-1.0-py3-none-any.whl\n# comment\n")
    assert wh.parse_have(freeze) == {"torch": "2.11.0+cu130", "transformers": "5.17.0",
                                     "mypkg": None}
    assert wh.parse_have("torch==2.11.0, numpy  pillow") == {"torch": "2.11.0", "numpy": None,
                                                             "pillow": None}
    image = wh.read_have(str(IMAGE))
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0"
    assert image["huggingface-hub"] == "1.33.0" and "diffusers" not in image


def _fake_wheel(folder: Path, name: str, version: str, requires=(), size=0) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
        zf.writestr("pad.bin", os.urandom(size))
    return path


def test_build_writes_install_script_and_manifest(tmp_path):
    out = tmp_path / "wheelhouse"
    (out / "wheels").mkdir(parents=True)
    stale = _fake_wheel(out / "wheels", "oldthing", "0.1")
    (out / "manifest.json").write_text('{"python": "3.11", "wheels": []}')  # an earlier build
    wheels = {}

    def index(name, spec, pin):
        path = _fake_wheel(out / "wheels", name, pin or "1.0", size=2000)
        wheels[name] = path
        got = wh.wheel_metadata(path)
        return wh.Wheel(got[0], got[1], path.name, path.stat().st_size, got[2])

    have = {**wh.read_have(str(IMAGE))}
    have.pop("python")
    manifest = wh.build(have, out, "3.12", "manylinux_2_28_x86_64", notebooks=False,
                        index=index)
    names = [w["name"] for w in manifest["wheels"]]
    assert names == ["diffusers", "torchao"]  # everything else is on the image; no pytest either
    assert manifest["total_bytes"] == sum(p.stat().st_size for p in wheels.values())
    assert not stale.exists()  # a wheel of an earlier build is not carried again
    script = (out / "install.sh").read_text()
    assert "want=3.12" in script and "--no-index" in script and ".pth" in script
    assert os.access(out / "install.sh", os.X_OK)
    assert json.loads((out / "manifest.json").read_text()) == manifest


class FakePip:
    """`pip download --no-deps -d DIR TARGET...` over a catalogue (name -> {version:
    requires}), as pip_index runs it: every pip process recorded; a target without a wheel
    fails the whole process and writes nothing, as pip does."""

    def __init__(self, packages):
        self.packages, self.processes = packages, []

    def run(self, cmd, **kwargs):
        into, targets = cmd[cmd.index("-d") + 1], cmd[cmd.index("-d") + 2:]
        self.processes.append(targets)
        picked = []
        for target in targets:
            req = wh.Requirement(target)
            versions = [v for v in self.packages.get(req.name, {})
                        if req.specifier.contains(v, prereleases=True)]
            if not versions:
                return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching "
                                                   f"distribution found for {target}\n")
            picked.append((req.name, max(versions, key=wh.Version)))
        for name, version in picked:
            _fake_wheel(Path(into), name, version, self.packages[name][version])
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_pip_index_downloads_each_breadth_of_the_walk_in_one_pip_process(tmp_path, monkeypatch):
    """One pip process per breadth of the walk, not one per wheel (each costs about 0.4 s of
    CPU to start), and the same wheels and order as an index that fetches one at a time."""
    packages = {"a": {"1.0": ["c", "d>=2"]}, "b": {"1.0": ["d"], "2.0": ["d", "e"]},
                "c": {"1.0": ["e"]}, "d": {"1.0": [], "2.0": [], "2.5": []}, "e": {"3.0": []}}
    pip = FakePip(packages)
    monkeypatch.setattr(wh, "subprocess", SimpleNamespace(run=pip.run))
    index = wh.pip_index(tmp_path / "wheels", "3.12", "manylinux_2_28_x86_64")
    wheels = wh.resolve(["a", "b"], {}, index, "3.12", pinned={"b": "1.0"})
    assert pip.processes == [["a", "b==1.0"], ["c", "d>=2"], ["e"]]
    one_at_a_time = wh.resolve(["a", "b"], {}, FakeIndex(packages), "3.12", pinned={"b": "1.0"})
    assert [(w.name, w.version, w.needed_by) for w in wheels] == [
        (w.name, w.version, w.needed_by) for w in one_at_a_time] == [
        ("a", "1.0", "fastdiff"), ("b", "1.0", "fastdiff"), ("c", "1.0", "a"),
        ("d", "2.5", "a"), ("e", "3.0", "c")]
    # the wheels are there now: a second walk downloads nothing
    pip.processes.clear()
    assert wh.resolve(["a", "b"], {}, index, "3.12", pinned={"b": "1.0"}) == wheels
    assert pip.processes == []
    # a breadth with a target that has no wheel: pip fails it whole, then each is asked alone,
    # and the Refusal names the one that has none
    packages["f"] = {"1.0": ["g>=9", "e"]}
    with pytest.raises(wh.Refusal, match=r"no wheel of g>=9 for Python 3\.12"):
        wh.resolve(["f"], {}, index, "3.12")
    assert pip.processes == [["f"], ["g>=9"], ["g>=9"]]  # e is in the folder already


def test_build_refuses_a_folder_that_is_not_a_wheelhouse_and_deletes_nothing(tmp_path):
    """Issue 35: build deletes the stale wheels of its --out, so it writes only into a new or
    empty folder or a wheelhouse (its manifest.json); a cut build's folder is still one."""
    out = tmp_path / "mine"
    (out / "wheels").mkdir(parents=True)
    theirs = _fake_wheel(out / "wheels", "theirs", "0.1")
    have = {**wh.read_have(str(IMAGE))}
    have.pop("python")

    def cut(name, spec, pin):
        raise wh.Refusal("cut")
    with pytest.raises(wh.Refusal, match="not a wheelhouse's .* give a new or empty --out"):
        wh.build(have, out, "3.12", "manylinux_2_28_x86_64", notebooks=False, index=cut)
    assert theirs.exists() and not (out / "manifest.json").exists()
    fresh = tmp_path / "fresh"
    with pytest.raises(wh.Refusal, match="cut"):
        wh.build(have, fresh, "3.12", "manylinux_2_28_x86_64", notebooks=False, index=cut)
    assert json.loads((fresh / "manifest.json").read_text())["state"] == "unfinished"
    wh.claim(fresh, "3.12", "manylinux_2_28_x86_64")  # the cut build's folder is still ours


def test_install_script_refuses_another_python(tmp_path):
    out = tmp_path / "wheelhouse"
    (out / "wheels").mkdir(parents=True)
    (out / "install.sh").write_text(wh.INSTALL_SH.replace("__PYTHON__", "3.9"))
    done = subprocess.run(["bash", str(out / "install.sh")], capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert done.returncode == 2 and "this wheelhouse is for Python 3.9" in done.stderr


def test_make_wheelhouse_without_have_says_what_to_give():
    done = subprocess.run(["make", "-s", "wheelhouse"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "HAVE= is empty" in done.stderr


# --- slow: real downloads (PyPI), an offline install into a fresh environment -------------------

@pytest.mark.slow
def test_image_wheelhouse_for_python_312_is_small_and_has_no_torch(tmp_path):
    out = tmp_path / "wheelhouse"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--have",
                           str(IMAGE), "--out", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    names = {w["name"] for w in manifest["wheels"]}
    assert manifest["python"] == "3.12" and {"diffusers", "torchao", "nbclient"} <= names
    assert not names & {"torch", "triton"} and not any(n.startswith("nvidia") for n in names)
    size = sum(p.stat().st_size for p in (out / "wheels").glob("*.whl"))
    assert size == manifest["total_bytes"] <= 30e6
    assert f"{size / 1e6:.1f} MB" in done.stdout


IMAGE_311 = ["torch==2.13.0", "transformers==5.17.0", "huggingface_hub==1.33.0",
             "tokenizers==0.23.2", "accelerate==1.15.0", "safetensors==0.8.0", "numpy", "pillow",
             "matplotlib", "tqdm", "pytest", "sentencepiece"]


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="torch 2.13 CPU is a 3.11 build here")
def test_offline_install_into_a_fresh_environment_runs_notebook_00_and_collects_gpu_tests(
        tmp_path):
    """A fresh Python 3.11 environment holding only torch 2.13 CPU and the GPU image's other
    versions (transformers 5.17, huggingface_hub 1.33, ...), no diffusers, torchao or Jupyter:
    make the wheelhouse from its pip freeze, install it with no index, then nbclient executes
    notebook 00 in smoke mode and pytest collects every test of tests/gpu."""
    env_dir = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    python = str(env_dir / "bin" / "python")
    # the image's own packages, not what is tested: unpacked without compiling their .py files
    # to bytecode (37 s against 15 s here for torch and the rest; imports compile what they use)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-compile", *IMAGE_311], check=True, timeout=1800)
    have = tmp_path / "have.txt"
    have.write_text(subprocess.run([python, "-m", "pip", "freeze"], capture_output=True,
                                   text=True, check=True).stdout)
    out = tmp_path / "wheelhouse"
    built = subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "--have",
                            str(have), "--python", "3.11", "--out", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    names = {w["name"] for w in json.loads((out / "manifest.json").read_text())["wheels"]}
    assert {"diffusers", "torchao", "nbclient", "ipykernel"} <= names and "torch" not in names

    offline = dict(os.environ, PYTHON=python, FASTDIFF_REPO=str(ROOT), PIP_NO_INDEX="1",
                   HF_HUB_OFFLINE="1")
    offline.pop("PYTHONPATH", None)
    installed = subprocess.run(["bash", str(out / "install.sh")], capture_output=True,
                               text=True, env=offline, timeout=900)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert "diffusers 0.42.1" in installed.stdout and "every version at or above" in installed.stdout

    run = dict(offline, FASTDIFF_SMOKE="1", MPLBACKEND="Agg", TQDM_DISABLE="1")
    script = ("import nbformat, nbclient, sys\n"
              f"nb = nbformat.read({str(ROOT / 'notebooks' / '00_setup.ipynb')!r}, 4)\n"
              "nbclient.NotebookClient(nb, timeout=900, kernel_name='python3', allow_errors=True,"
              f" resources={{'metadata': {{'path': {str(ROOT / 'notebooks')!r}}}}}).execute()\n"
              "errors = [o.get('ename') + ': ' + o.get('evalue', '') for c in nb.cells "
              "for o in c.get('outputs', []) if o.get('output_type') == 'error']\n"
              "print('ERRORS', errors)\nsys.exit(1 if errors else 0)\n")
    executed = subprocess.run([python, "-c", script], capture_output=True, text=True, env=run,
                              cwd=tmp_path, timeout=1800)
    assert executed.returncode == 0, (executed.stdout[-3000:], executed.stderr[-3000:])

    collected = subprocess.run([python, "-m", "pytest", "tests/gpu", "-m", "gpu",
                                "--collect-only", "-q", "-p", "no:cacheprovider"],
                               capture_output=True, text=True, env=offline, cwd=ROOT,
                               timeout=600)
    expected = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "--collect-only",
                               "-q", "-p", "no:cacheprovider"], capture_output=True, text=True,
                              cwd=ROOT, timeout=600)
    count = [line for line in expected.stdout.splitlines() if "tests collected" in line]
    assert collected.returncode == 0, collected.stdout[-2000:]
    assert count and count[0].split(" in ")[0] in collected.stdout, collected.stdout[-2000:]
