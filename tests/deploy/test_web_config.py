# SPDX-License-Identifier: Apache-2.0
"""Web configs in exporter-toolkit's schema, against the real tools: each file passes
`promtool check web-config` first, then mergewatchd starts with it and serves it to curl, openssl s_client and a
real Prometheus scraping over TLS. TLS versions, cipher suites and curves are checked by handshakes that must
fail; certificates and the whole file are re-read when they change on disk.

openssl s_client runs with `-cipher DEFAULT@SECLEVEL=0`: Debian's OpenSSL refuses TLS 1.0/1.1 on its own at its
default level, so only at level 0 does a failed handshake show the server's refusal.
"""
import os
import re
import subprocess

import pytest
import yaml

from conftest import REPO, free_port, http_get, run, start_daemon, tool, wait_until

pytestmark = pytest.mark.privileged

SECLEVEL0 = "DEFAULT@SECLEVEL=0"


def openssl(*args):
    r = run(["openssl", *args])
    assert r.returncode == 0, r.stderr


class Pki:
    """A CA, a server certificate for 127.0.0.1 it signed, and client certificates (one from another CA)."""

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.ca("ca")
        self.ca("other-ca")
        self.leaf("server", "ca", san="subjectAltName=DNS:localhost,IP:127.0.0.1")
        self.leaf("client", "ca")
        self.leaf("stranger", "other-ca")

    def path(self, name):
        return os.path.join(self.dir, name)

    def ca(self, name):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                "-subj", f"/CN={name}", "-keyout", self.path(f"{name}.key"), "-out", self.path(f"{name}.crt"))

    def leaf(self, name, signer, san=None):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
                "-keyout", self.path(f"{name}.key"), "-out", self.path(f"{name}.csr"))
        ext = []
        if san:
            ext_file = self.path(f"{name}.ext")
            with open(ext_file, "w") as f:
                f.write(san + "\n")
            ext = ["-extfile", ext_file]
        openssl("x509", "-req", "-in", self.path(f"{name}.csr"), "-CA", self.path(f"{signer}.crt"), "-CAkey",
                self.path(f"{signer}.key"), "-CAcreateserial", "-days", "2", "-out", self.path(f"{name}.crt"), *ext)

    def fingerprint(self, name):
        r = run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", self.path(name)])
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split("=", 1)[1]


@pytest.fixture
def pki(workdir):
    return Pki(os.path.join(workdir, "pki"))


def write_config(workdir, name, tls_extra=None, top_extra=None, promtool=True):
    config = {"tls_server_config": {"cert_file": "pki/server.crt", "key_file": "pki/server.key", **(tls_extra or {})},
              **(top_extra or {})}
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    if not promtool:
        return path
    r = run([tool("promtool"), "check", "web-config", path])
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, f"promtool refuses {config}: {r.stdout}{r.stderr}"
    return path


def curl(pki, port, *extra, path="/metrics"):
    """(exit code, HTTP status, headers) of curl against the daemon, trusting the test CA."""
    r = run(["curl", "-sS", "-D", "-", "-o", "/dev/null", "--cacert", pki.path("ca.crt"), *extra,
             f"https://127.0.0.1:{port}{path}"])
    status = re.search(r"^HTTP/\S+ (\d+)", r.stdout, re.M)
    return r.returncode, int(status.group(1)) if status else 0, r.stdout


def handshake(port, *args):
    """openssl s_client's output; (True, text) when a TLS session was established."""
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", *args],
                       input="", capture_output=True, text=True, timeout=20)
    text = r.stdout + r.stderr
    established = r.returncode == 0 and re.search(r"^New, TLSv1\S*, Cipher is (?!\(NONE\))", text, re.M) is not None
    return established, text


def served_fingerprint(port):
    ok, text = handshake(port)
    if not ok:
        return None
    pem = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", text, re.S)
    r = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=pem.group(0),
                       capture_output=True, text=True, timeout=10)
    return r.stdout.strip().split("=", 1)[1]


def test_tls_floor_versions_ciphers_and_curves(workdir, processes, pki):
    """No min_version: TLS 1.0 and 1.1 handshakes fail, 1.2 and 1.3 succeed. min_version TLS10 lets 1.0 in (so the
    refusal above is the daemon's), max_version TLS12 keeps 1.3 out; cipher_suites and curve_preferences admit only
    what they list."""
    daemon, port = start_daemon(processes, f"--web.config.file={write_config(workdir, 'default.yml')}")
    for version in ("-tls1", "-tls1_1"):
        ok, text = handshake(port, version, "-cipher", SECLEVEL0)
        assert not ok, f"{version} must fail against the TLS 1.2 floor:\n{text}"
    for version in ("-tls1_2", "-tls1_3"):
        ok, text = handshake(port, version)
        assert ok, f"{version}:\n{text}"
    daemon.stop()

    config = write_config(workdir, "old.yml", {"min_version": "TLS10", "max_version": "TLS12"})
    daemon, port = start_daemon(processes, f"--web.config.file={config}", name="old")
    assert handshake(port, "-tls1", "-cipher", SECLEVEL0)[0]
    assert not handshake(port, "-tls1_3")[0]
    daemon.stop()

    config = write_config(workdir, "suites.yml", {
        "max_version": "TLS12", "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
        "curve_preferences": ["CurveP384"], "prefer_server_cipher_suites": True})
    daemon, port = start_daemon(processes, f"--web.config.file={config}", name="suites")
    # The certificate is P-256: TLS 1.2 clients must list that curve for its signature (-groups), whatever the
    # key exchange uses. Offered P-256 first, the key exchange still takes the configured P-384.
    ok, text = handshake(port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256", "-groups", "P-256:P-384")
    assert ok and "ECDHE-ECDSA-AES128-GCM-SHA256" in text and re.search(r"Server Temp Key: ECDH, (secp384r1|P-384)",
                                                                         text), text
    assert not handshake(port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384", "-groups", "P-256:P-384")[0]
    assert not handshake(port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256", "-groups", "P-256")[0]
    code, status, _ = curl(pki, port, "--tlsv1.2", "--curves", "prime256v1:secp384r1")
    assert (code, status) == (0, 200)


def test_headers_and_every_client_auth_type(workdir, processes, pki):
    """Each client_auth_type exporter-toolkit has, with http_server_config.headers on every response: which
    client certificates get the metrics (200), which are refused (403 or no handshake)."""
    headers = {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
               "Strict-Transport-Security": "max-age=31536000"}
    client = ["--cert", pki.path("client.crt"), "--key", pki.path("client.key")]
    stranger = ["--cert", pki.path("stranger.crt"), "--key", pki.path("stranger.key")]
    # client_auth_type -> (status without a certificate, with the CA's client, with another CA's)
    expected = {
        "NoClientCert": (200, 200, 200),
        "RequestClientCert": (200, 200, 200),
        "RequireAnyClientCert": (403, 200, 200),
        "VerifyClientCertIfGiven": (200, 200, 403),
        "RequireAndVerifyClientCert": (403, 200, 403),
    }
    for auth, (none, good, other) in expected.items():
        tls = {"client_auth_type": auth, "min_version": "TLS12"}
        if "Verify" in auth:
            tls["client_ca_file"] = "pki/ca.crt"
        config = write_config(workdir, f"{auth}.yml", tls, {"http_server_config": {"headers": headers}})
        daemon, port = start_daemon(processes, f"--web.config.file={config}", name=auth)
        got = tuple(curl(pki, port, *extra)[1] for extra in ([], client, stranger))
        assert got == (none, good, other), f"{auth}: {got}"
        _, status, text = curl(pki, port, *client)
        for name, value in headers.items():
            assert re.search(rf"^{name}: {re.escape(value)}\r?$", text, re.M | re.I), f"{auth}: {name} missing:\n{text}"
        _, status, text = curl(pki, port, *client, path="/nowhere")
        assert status == 404 and "X-Frame-Options: deny" in text
        daemon.stop()


def test_unsupported_settings_are_refused_naming_the_key(workdir, processes):
    """What GnuTLS cannot do is refused at start (exit 2), the message naming the key. client_allowed_sans is newer
    than Debian 12's promtool (2.42), which refuses it itself; the cipher list is promtool-valid but GnuTLS selects
    by key exchange x cipher x MAC, so it would let in two suites it does not name."""
    cases = [
        ({"client_allowed_sans": ["prometheus"], "client_auth_type": "RequireAndVerifyClientCert",
          "client_ca_file": "pki/ca.crt"}, "tls_server_config.client_allowed_sans", False),
        ({"cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"]},
         "tls_server_config.cipher_suites", True),
    ]
    Pki(os.path.join(workdir, "pki"))
    for i, (tls, key, promtool_knows) in enumerate(cases):
        config = write_config(workdir, f"refused{i}.yml", tls, promtool=promtool_knows)
        r = run([os.environ.get("MERGEWATCHD", os.path.join(REPO, "build", "mergewatchd")),
                 "--web.listen-address=127.0.0.1:0", f"--web.config.file={config}"])
        assert r.returncode == 2 and key in r.stderr, (r.returncode, r.stderr)
    config = os.path.join(workdir, "header.yml")
    with open(config, "w") as f:
        yaml.safe_dump({"http_server_config": {"headers": {"Server": "x"}}}, f)
    r = run([os.environ.get("MERGEWATCHD", os.path.join(REPO, "build", "mergewatchd")),
             "--web.listen-address=127.0.0.1:0", f"--web.config.file={config}"])
    assert r.returncode == 2 and "http_server_config.headers" in r.stderr and "Server" in r.stderr, r.stderr


def test_prometheus_scrapes_over_tls_with_a_client_certificate(workdir, processes, pki):
    """A real Prometheus with a TLS scrape config (CA, client certificate) scrapes the daemon serving a config with
    min_version, curve_preferences, client_auth_type RequireAndVerifyClientCert and headers."""
    config = write_config(workdir, "prom.yml", {
        "min_version": "TLS12", "curve_preferences": ["X25519", "CurveP256"],
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "pki/ca.crt"},
        {"http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}}})
    daemon, port = start_daemon(processes, f"--web.config.file={config}")
    prom_port = free_port()
    while prom_port == port:
        prom_port = free_port()
    prom_config = os.path.join(workdir, "prometheus.yml")
    with open(prom_config, "w") as f:
        yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                        "scrape_configs": [{"job_name": "mergewatch", "scheme": "https",
                                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                                            "tls_config": {"ca_file": pki.path("ca.crt"),
                                                           "cert_file": pki.path("client.crt"),
                                                           "key_file": pki.path("client.key")}}]}, f)
    r = run([tool("promtool"), "check", "config", prom_config])
    assert r.returncode == 0, r.stdout + r.stderr
    data = os.path.join(workdir, "prom-data")
    os.mkdir(data)
    prom = processes("prometheus", [tool("prometheus"), f"--config.file={prom_config}",
                                    f"--web.listen-address=127.0.0.1:{prom_port}", f"--storage.tsdb.path={data}"])

    def scraped():
        prom.assert_running()
        import json
        _, body = http_get(f"http://127.0.0.1:{prom_port}/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"]
        return targets and targets[0]["health"] == "up" and targets
    wait_until(scraped, 60, "Prometheus to scrape mergewatchd over TLS", interval=0.5, on_timeout=prom.log)

    def series():
        import json
        _, body = http_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=mergewatch_build_info")
        return json.loads(body)["data"]["result"]
    wait_until(series, 30, "mergewatch_build_info in Prometheus", interval=0.5)


def test_certificate_and_config_reloaded_without_restart(workdir, processes, pki):
    """A certificate replaced on disk is served to the next handshake, without a restart; an invalid replacement is
    logged and the last good one kept; basic_auth_users added to the file apply too."""
    config = write_config(workdir, "reload.yml")
    daemon, port = start_daemon(processes, f"--web.config.file={config}")
    first = pki.fingerprint("server.crt")
    assert served_fingerprint(port) == first

    pki.leaf("server2", "ca", san="subjectAltName=DNS:localhost,IP:127.0.0.1")
    second = pki.fingerprint("server2.crt")
    assert second != first
    # Key first, then certificate, each renamed over the old one (as certbot and cert-manager do): in between the
    # pair does not match, which must leave the old one served.
    def kept(times):
        with open(daemon.log_path, errors="replace") as f:
            return f.read().count("keeping the last good one") >= times

    os.replace(pki.path("server2.key"), pki.path("server.key"))
    # Until the daemon has seen the lone key (its check every 500 ms) and refused the pair.
    wait_until(lambda: kept(1), 30, "the mismatched key to be refused", on_timeout=daemon.log)
    assert served_fingerprint(port) == first
    os.replace(pki.path("server2.crt"), pki.path("server.crt"))
    wait_until(lambda: served_fingerprint(port) == second, 30, "the replaced certificate to be served")
    assert daemon.pid == daemon.proc.pid and daemon.running()

    with open(pki.path("server.crt"), "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    wait_until(lambda: kept(2), 30, "the invalid certificate to be logged", on_timeout=daemon.log)
    assert served_fingerprint(port) == second

    import bcrypt
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(10)).decode()
    os.replace(pki.path("server.crt"), pki.path("server.crt.bad"))
    pki.leaf("server", "ca", san="subjectAltName=DNS:localhost,IP:127.0.0.1")
    third = pki.fingerprint("server.crt")
    with open(config, "w") as f:
        yaml.safe_dump({"tls_server_config": {"cert_file": "pki/server.crt", "key_file": "pki/server.key"},
                        "basic_auth_users": {"prometheus": hashed}}, f)
    wait_until(lambda: curl(pki, port)[1] == 401, 30, "basic auth from the rewritten file", on_timeout=daemon.log)
    assert curl(pki, port, "-u", "prometheus:secret")[1] == 200
    assert served_fingerprint(port) == third
    assert daemon.running()
