"""Unit tests of the address guard on address *values*: nothing here opens a connection.

The fetch-level tests (tests/web/test_fetch.py) check the guard against loopback sites only.
"""

from __future__ import annotations

import ipaddress

import pytest

from common.core.config import load_settings
from common.core.errors import ConfigError
from common.web.netguard import AddressGuard, guard_from_setting, parse_networks

DEFAULT = AddressGuard()

REFUSED_BY_DEFAULT = [
    # loopback
    "127.0.0.1", "127.255.255.254", "::1",
    # private (RFC 1918), with the edges of 172.16/12
    "10.0.0.1", "10.255.255.255", "172.16.0.0", "172.20.1.1", "172.31.255.255",
    "192.168.0.1", "192.168.255.255",
    # link-local, cloud metadata included
    "169.254.169.254", "169.254.0.1", "fe80::1", "fe80::1%eth0",
    # CGNAT 100.64.0.0/10, both ends
    "100.64.0.0", "100.100.100.200", "100.127.255.255",
    # multicast, link-local and global scope
    "224.0.0.1", "224.0.1.1", "239.255.255.250", "ff02::1", "ff0e::1",
    # unspecified, reserved, broadcast, "this network"
    "0.0.0.0", "::", "0.1.2.3", "240.0.0.1", "255.255.255.255",
    # unique local fc00::/7
    "fc00::1", "fd12:3456:789a::1",
    # IPv4-mapped IPv6 of non-public IPv4
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:192.168.1.1",
    # documentation and benchmarking ranges are not routable either
    "192.0.2.1", "198.51.100.7", "203.0.113.9", "198.18.0.1", "2001:db8::1",
    # IETF special-purpose blocks
    "192.0.0.1", "100::1", "::127.0.0.1",
]

ALLOWED_BY_DEFAULT = [
    # Values only: these are never connected to.
    "93.184.216.34", "8.8.8.8", "1.1.1.1",
    "172.15.255.255", "172.32.0.0",          # just outside 172.16.0.0/12
    "100.63.255.255", "100.128.0.0",         # just outside 100.64.0.0/10
    "192.167.255.255", "192.169.0.0",        # just outside 192.168.0.0/16
    "11.0.0.1", "9.255.255.255",             # just outside 10.0.0.0/8
    "2606:2800:220:1:248:1893:25c8:1946", "2001:4860:4860::8888",
    "::ffff:93.184.216.34",                  # mapped public IPv4 is that IPv4
]


@pytest.mark.parametrize("address", REFUSED_BY_DEFAULT)
def test_non_public_addresses_are_refused_by_default(address):
    assert DEFAULT.allowed(address) is False


@pytest.mark.parametrize("address", ALLOWED_BY_DEFAULT)
def test_public_unicast_addresses_are_allowed_by_default(address):
    assert DEFAULT.allowed(address) is True


def test_deprecated_site_local_ipv6_is_refused():
    # fec0::/10 (RFC 3879) is not globally routable unicast, so by the module's contract
    # ("allowed: globally routable unicast") it must be refused like fc00::/7.
    assert DEFAULT.allowed("fec0::1") is False


def test_the_172_16_block_edges_are_exact():
    assert DEFAULT.allowed("172.15.255.255") and not DEFAULT.allowed("172.16.0.0")
    assert not DEFAULT.allowed("172.31.255.255") and DEFAULT.allowed("172.32.0.0")


def test_address_objects_are_accepted_as_well_as_strings():
    assert DEFAULT.allowed(ipaddress.ip_address("93.184.216.34"))
    assert not DEFAULT.allowed(ipaddress.ip_address("10.0.0.1"))
    assert not DEFAULT.allowed(ipaddress.ip_address("::ffff:127.0.0.1"))


@pytest.mark.parametrize("garbage", [
    "", " ", "localhost", "not-an-ip", "127.0.0.1.1", "999.1.1.1", "127.1", "0x7f000001",
    "10.0.0.0/8", "127.0.0.1:80", "[::1]", "::1::", "1.2.3.4 ", "\x00", "%eth0",
])
def test_garbage_strings_are_refused_not_raised(garbage):
    assert DEFAULT.allowed(garbage) is False
    assert AddressGuard(parse_networks("0.0.0.0/0, ::/0")).allowed(garbage) is False


def test_allowlist_of_127_0_0_0_8_permits_loopback_v4_only():
    guard = AddressGuard(parse_networks("127.0.0.0/8"))
    assert guard.allowed("127.0.0.1") and guard.allowed("127.0.0.2")
    assert guard.allowed("127.255.255.254")
    assert guard.allowed("::ffff:127.0.0.1")  # the mapped form is the same host
    assert not guard.allowed("::1")
    assert not guard.allowed("10.0.0.1") and not guard.allowed("::ffff:10.0.0.1")
    assert not guard.allowed("169.254.169.254") and not guard.allowed("192.168.1.1")
    assert guard.allowed("93.184.216.34")  # an allowlist adds to the public default


def test_allowlist_of_one_host_does_not_open_its_neighbours():
    guard = AddressGuard(parse_networks("127.0.0.1/32"))
    assert guard.allowed("127.0.0.1")
    assert not guard.allowed("127.0.0.2") and not guard.allowed("127.0.0.0")


def test_ipv6_allowlist_entries_work():
    guard = AddressGuard(parse_networks("::1/128, fd00::/8"))
    assert guard.allowed("::1") and guard.allowed("fd00::5")
    assert not guard.allowed("127.0.0.1") and not guard.allowed("fc00::1")


def test_parse_networks_reads_a_comma_separated_list():
    assert parse_networks("127.0.0.0/8, ::1/128") == (
        ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
    assert parse_networks(" 10.0.0.0/8 ,, 127.0.0.1 ,") == (
        ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1/32"))
    assert parse_networks("127.0.0.1/8") == (ipaddress.ip_network("127.0.0.0/8"),)  # host bits
    assert parse_networks("") == () and parse_networks(" , ") == ()


@pytest.mark.parametrize("bad", ["bad", "10.0.0.0/33", "300.0.0.0/8", "127.0.0.0/8x", "::1/129",
                                 "localhost"])
def test_parse_networks_error_names_the_bad_entry(bad):
    with pytest.raises(ValueError) as info:
        parse_networks(f"192.0.2.0/24, {bad}, ::1/128")
    assert repr(bad) in str(info.value)
    # The good entries around it are not blamed.
    assert "192.0.2.0/24" not in str(info.value) and "::1/128" not in str(info.value)


def test_guard_from_setting_raises_a_config_error_naming_the_variable():
    assert guard_from_setting("127.0.0.0/8").allowed("127.0.0.1")
    assert not guard_from_setting("").allowed("127.0.0.1")
    with pytest.raises(ConfigError) as info:
        guard_from_setting("127.0.0.0/8,nonsense")
    assert "FETCH_ALLOW_NETWORKS" in str(info.value) and "'nonsense'" in str(info.value)


def test_load_settings_rejects_a_bad_fetch_allow_networks_naming_the_variable():
    with pytest.raises(ConfigError) as info:
        load_settings({"FETCH_ALLOW_NETWORKS": "bad"})
    assert "FETCH_ALLOW_NETWORKS" in str(info.value) and "'bad'" in str(info.value)


def test_load_settings_parses_fetch_allow_networks_into_networks():
    assert load_settings({}).fetch_allow_networks == ()
    assert load_settings({"FETCH_ALLOW_NETWORKS": ""}).fetch_allow_networks == ()
    settings = load_settings({"FETCH_ALLOW_NETWORKS": "127.0.0.0/8, ::1/128"})
    assert settings.fetch_allow_networks == (
        ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
    guard = AddressGuard(settings.fetch_allow_networks)
    assert guard.allowed("127.0.0.1") and guard.allowed("::1") and not guard.allowed("10.0.0.1")


def test_refusal_reason_names_the_address_and_the_setting():
    reason = DEFAULT.reason("169.254.169.254")
    assert "169.254.169.254" in reason and "FETCH_ALLOW_NETWORKS" in reason
