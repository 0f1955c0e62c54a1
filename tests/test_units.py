import pytest

from hvgpu.units import BadValue, format_size, parse_share, parse_size


@pytest.mark.parametrize("text, value", [
    ("4G", 4 << 30), ("4096M", 4 << 30), ("4GiB", 4 << 30), ("0.5G", 512 << 20),
    ("512MiB", 512 << 20), ("1024", 1024), ("2 g", 2 << 30), ("1T", 1 << 40), (".5G", 512 << 20),
])
def test_sizes_operators_type(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4X", "-1G", "0", "G", "four", "4GB5"])
def test_bad_sizes_say_how_to_write_one(text):
    with pytest.raises(BadValue):
        parse_size(text)


@pytest.mark.parametrize("text, pct", [("25%", 25), ("0.25", 25), ("1", 100), ("100%", 100),
                                       ("50", 50)])
def test_shares(text, pct):
    assert parse_share(text) == pct


@pytest.mark.parametrize("text", ["0%", "101%", "abc", "12.5%", "-0.1"])
def test_bad_shares(text):
    with pytest.raises(BadValue):
        parse_share(text)


def test_sizes_print_the_way_they_are_typed():
    assert format_size(4 << 30) == "4 GiB"
    assert format_size(1536 << 20) == "1.5 GiB"
    assert format_size(100) == "100 B"
