# build_backend.py: the package's PEP 517 build backend, in the tree and of the standard library
# alone: pyproject.toml requires nothing, so `pip install ./python` needs no index (setuptools
# would have to be fetched into pip's isolated build environment, which fails offline).
# It builds the pure-Python wheel of fattn/ (metadata from pyproject's [project] table), an
# editable wheel (a .pth naming this directory) and an sdist; libfattn.so is never packaged.
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "fattn"


def _project():
    """pyproject.toml's [project] table."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib  # Python 3.11+
        return tomllib.loads(text)["project"]
    except ImportError:
        pass
    # Older Pythons: the table's own forms, `key = "text"` and `key = { extra = ["dist", ..] }`.
    project, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "project" and "=" in line and not line.startswith("#"):
            key, value = (part.strip() for part in line.split("=", 1))
            if value.startswith("{"):
                project[key] = {k: re.findall(r'"([^"]*)"', v)
                                for k, v in re.findall(r'([\w-]+)\s*=\s*\[([^\]]*)\]', value)}
            else:
                project[key] = value.strip('"')
    return project


def _metadata(project):
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}",
             f"Version: {project['version']}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    for extra, dists in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in dists]
    return "\n".join(lines) + "\n"


def _dist_info(project):
    return f"{project['name']}-{project['version']}.dist-info"


def _wheel(wheel_directory, files):
    """Writes the wheel of files ({archive path: bytes}) with its dist-info; returns its name."""
    project = _project()
    info = _dist_info(project)
    files = dict(files)
    files[f"{info}/METADATA"] = _metadata(project).encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: fattn build_backend\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{project['name']}-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return name


def _sources():
    """{path under python/: bytes} of the package's modules."""
    out = {}
    for name in sorted(os.listdir(os.path.join(HERE, PACKAGE))):
        if name.endswith(".py"):
            with open(os.path.join(HERE, PACKAGE, name), "rb") as f:
                out[f"{PACKAGE}/{name}"] = f.read()
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _sources())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # The .pth puts this directory on sys.path: fattn imports from the checkout (and finds the
    # checkout's build/libfattn.so), as do the tests/ beside it.
    return _wheel(wheel_directory, {f"{PACKAGE}.pth": (HERE + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{project['name']}-{project['version']}"
    files = {"pyproject.toml": None, "build_backend.py": None, **_sources()}
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        pkg_info = _metadata(project).encode()
        entries = [("PKG-INFO", pkg_info)]
        for path, data in files.items():
            if data is None:
                with open(os.path.join(HERE, path), "rb") as f:
                    data = f.read()
            entries.append((path, data))
        for path, data in entries:
            member = tarfile.TarInfo(f"{base}/{path}")
            member.size, member.mode = len(data), 0o644
            tar.addfile(member, io.BytesIO(data))
    return name
