import json
import pytest

from conftest import run_module
from scalebox_ms.doctor import cann_compat, numpy_check, supported_cann_versions


@pytest.mark.integration
def test_doctor_json_reports_a_working_cpu_backend():
    r = run_module("doctor", "--json")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["usable"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["backend:cpu"]["status"] == "ok" and "match numpy" in checks["backend:cpu"]["detail"]
    assert checks["numpy"]["status"] == "ok" and checks["numpy"]["detail"].startswith("1.")
    assert {"python", "mindspore", "gymnasium", "threads", "devices"} <= set(checks)


def test_numpy_2_with_mindspore_2_10_is_a_failure():
    assert numpy_check("2.1.3", "2.10.0")["status"] == "fail"
    assert numpy_check("1.26.4", "2.10.0")["status"] == "ok"
    assert numpy_check("2.1.3", "2.11.0")["status"] == "ok"


def test_cann_version_is_checked_against_mindspores_supported_list():
    supported = supported_cann_versions()
    assert supported, "MindSpore 2.10 carries its supported CANN versions"
    assert cann_compat(f"Version={supported[0]}.RC1", supported)["status"] == "ok"
    assert cann_compat("Version=6.0.RC1", supported)["status"] == "warn"


def test_cann_version_is_read_from_the_version_line_not_comments(tmp_path, monkeypatch):
    from scalebox_ms import doctor

    (tmp_path / "compiler").mkdir()
    (tmp_path / "compiler" / "version.info").write_text("# version: 1.0\nVersion=6.0.RC1\n")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    checks = {c["name"]: c for c in doctor.ascend_checks()}
    assert checks["cann"]["detail"].startswith("Version=6.0.RC1")
    assert checks["cann-match"]["status"] == "warn" and "6.0.RC1" in checks["cann-match"]["detail"]
    assert checks["ascend-driver"]["status"] == "warn"  # no driver on this machine
