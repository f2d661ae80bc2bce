"""TLS to brokers: port 5671 by default, and each broker's own name verified."""

from __future__ import annotations

import ssl

import pytest

from kombu_beetle.errors import BrokerTLSError
from kombu_beetle.options import BrokerAddress, build_options


def test_ssl_in_the_url_gives_brokers_without_a_port_5671():
    options = build_options("beetle://h1,h2:6000/?ssl=1&additional_subscription_brokers=h3", None)
    assert [b.name for b in options.all_brokers] == ["h1:5671", "h2:6000", "h3:5671"]
    assert options.ssl is True


@pytest.mark.parametrize(
    ("url", "transport_options", "ssl_arg"),
    [
        ("beetle://h1/", {"ssl": {"ca_certs": "/ca.pem"}}, False),
        ("beetle://h1/", None, {"ca_certs": "/ca.pem"}),
        ("beetle://h1/?ssl=true", None, False),
    ],
    ids=["transport-option", "broker_use_ssl", "url"],
)
def test_every_way_of_asking_for_tls_defaults_the_port_to_5671(url, transport_options, ssl_arg):
    options = build_options(url, transport_options, ssl=ssl_arg)
    assert options.brokers == (BrokerAddress("h1", 5671),)


def test_ssl_off_in_the_url_keeps_5672_even_when_kombu_asked_for_tls():
    options = build_options("beetle://h1/?ssl=0", None, ssl=True)
    assert options.brokers == (BrokerAddress("h1", 5672),) and options.ssl is False


def test_each_broker_verifies_its_own_host_name_by_default():
    options = build_options("beetle://a.example,b.example/", {"ssl": {"ca_certs": "/ca.pem"}})
    a, b = options.brokers
    assert options.ssl_for(a) == {"ca_certs": "/ca.pem", "server_hostname": "a.example"}
    assert options.ssl_for(b) == {"ca_certs": "/ca.pem", "server_hostname": "b.example"}
    assert options.ssl == {"ca_certs": "/ca.pem"}  # the shared options are not changed


def test_ssl_true_verifies_against_the_system_cas_and_the_host_name():
    options = build_options("beetle://10.0.0.7/?ssl=1")
    assert options.ssl_for(options.brokers[0]) == {"server_hostname": "10.0.0.7"}


def test_per_broker_ssl_options_win_and_an_explicit_server_hostname_is_kept():
    options = build_options(
        "beetle://a.example,b.example/",
        {
            "ssl": {"ca_certs": "/ca.pem"},
            "broker_options": {
                "b.example:5671": {"ssl": {"ca_certs": "/b-ca.pem", "server_hostname": "rmq-b"}}
            },
        },
    )
    a, b = options.brokers
    assert options.ssl_for(a)["ca_certs"] == "/ca.pem"
    assert options.ssl_for(b) == {"ca_certs": "/b-ca.pem", "server_hostname": "rmq-b"}


def test_verification_is_off_only_when_asked_for():
    options = build_options("beetle://h1/", {"ssl": {"cert_reqs": ssl.CERT_NONE}})
    assert options.ssl_for(options.brokers[0]) == {"cert_reqs": ssl.CERT_NONE}
    plain = build_options("beetle://h1/")
    assert plain.ssl_for(plain.brokers[0]) is False


def test_the_context_form_checks_the_host_name_too():
    options = build_options("beetle://h1/", {"ssl": {"context": {"cafile": "/ca.pem"}}})
    tls = options.ssl_for(options.brokers[0])
    assert tls["context"] == {"cafile": "/ca.pem", "check_hostname": True}
    assert tls["server_hostname"] == "h1"


def test_a_tls_failure_names_the_broker_and_what_to_check():
    reason = ssl.SSLCertVerificationError(1, "certificate verify failed")
    reason.verify_message = "Hostname mismatch, certificate is not valid for '127.0.0.1'."
    error = BrokerTLSError("127.0.0.1:5671", reason)
    assert str(error).startswith(
        "TLS to broker 127.0.0.1:5671 failed: Hostname mismatch, certificate is not valid"
    )
    assert "ca_certs" in str(error) and "broker_options" in str(error)
