import pytest

from hvgpu.units import BadValue, format_size, parse_share, parse_region_size, parse_size


@pytest.mark.parametrize("text, value", [
    ("4G", 4 << 30), ("4096M", 4 << 30), ("4GiB", 4 << 30), ("0.5G", 512 << 20),
    ("512MiB", 512 << 20), ("1024B", 1024), ("2 g", 2 << 30), ("1T", 1 << 40), (".5G", 512 << 20),
    ("1.5G", 1536 << 20), (4096, 4096),
])
def test_sizes_operators_type(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4X", "-1G", "0G", "G", "four", "4GB5", True])
def test_bad_sizes_say_how_to_write_one(text):
    with pytest.raises(BadValue) as info:
        parse_size(text)
    assert "512M, 4G, 4GiB or 1.5G" in str(info.value) or "more than zero" in str(info.value)


@pytest.mark.parametrize("text", ["4", "4096", "0", "1.5", " 4 "])
def test_a_size_without_a_unit_is_refused_listing_the_forms_and_what_units_mean(text):
    # "--mem 4" was a 4-byte slice
    with pytest.raises(BadValue) as info:
        parse_size(text)
    said = str(info.value)
    assert "has no unit" in said
    assert "512M, 4G, 4GiB or 1.5G" in said and "powers of 1024: 1G = 1024M" in said


@pytest.mark.parametrize("text, pct", [("25%", 25), ("0.25", 25), ("100%", 100), ("50%", 50),
                                       ("0.5", 50), ("0.29", 29), ("1%", 1), (".75", 75)])
def test_shares(text, pct):
    assert parse_share(text) == pct


@pytest.mark.parametrize("text", ["0%", "101%", "abc", "12.5%", "-0.1", "0.125", "0"])
def test_bad_shares(text):
    with pytest.raises(BadValue):
        parse_share(text)


@pytest.mark.parametrize("text", ["1", "2", "50", "1.0", "100"])
def test_a_share_without_percent_must_be_a_fraction_below_one(text):
    # "--compute 1" meant 100% while "--compute 2" meant 2%
    with pytest.raises(BadValue) as info:
        parse_share(text)
    assert "25%" in str(info.value) and "fraction below 1" in str(info.value)


def test_sizes_print_the_way_they_are_typed():
    assert format_size(4 << 30) == "4 GiB"
    assert format_size(1536 << 20) == "1.5 GiB"
    assert format_size(100) == "100 B"


@pytest.mark.parametrize("text, value", [
    ("1M", 1 << 20), ("1G", 1 << 30), ("512MiB", 512 << 20), ("0.5G", 512 << 20),
    ("1T", 1 << 40), ("0", 0), (0, 0), (4 << 20, 4 << 20),
])
def test_region_sizes(text, value):
    assert parse_region_size(text) == value


@pytest.mark.parametrize("text", ["3G", "1.5G", "512K", "1048575", "1048576", "2T", 3 << 20,
                                  1 << 19, -(1 << 20), True])
def test_a_region_size_that_is_no_ivshmem_bar_says_what_is_accepted(text):
    with pytest.raises(BadValue) as info:
        parse_region_size(text)
    assert "power of two from 1 MiB to 1 TiB" in str(info.value)
    assert "1M, 2M, 4M, ... 512M, 1G, 2G" in str(info.value)


def test_a_region_size_that_is_no_size_says_so():
    with pytest.raises(BadValue, match="is not a size"):
        parse_region_size("lots")


# -- the sizes a slice can have, and how sizes read --------------------------------------

from hvgpu.units import MAX_SIZE, MIN_MEM, parse_mem  # noqa: E402


@pytest.mark.parametrize("text", ["10B", "1023K", "0.5M", 1000])
def test_a_memory_quota_below_a_mib_is_refused(text):
    with pytest.raises(BadValue) as info:
        parse_mem(text)
    assert "a slice's memory quota is at least 1 MiB" in str(info.value)
    assert "whole MiB" in str(info.value)


def test_the_smallest_memory_quota_is_a_mib():
    assert MIN_MEM == 1 << 20 and parse_mem("1M") == 1 << 20 and parse_mem("1.5M") == 3 << 19


@pytest.mark.parametrize("text", ["99999999999999999999999G", "1025T", "2048TiB",
                                  "9" * 400 + "K", MAX_SIZE + 1])
def test_an_absurd_size_is_refused_without_echoing_a_float_s_figure(text):
    with pytest.raises(BadValue) as info:
        parse_size(text)
    said = str(info.value)
    assert "is more than 1024 TiB, more than any host or GPU has" in said
    assert "99999999999999991611392" not in said


def test_sizes_are_read_exactly():
    assert parse_size("1024T") == MAX_SIZE
    assert parse_size("1.1G") == 1181116006  # 1.1 * 2**30, rounded down
    assert parse_size("0.1K") == 102
    assert parse_size("4." + "0" * 60 + "1G") == 4 << 30


@pytest.mark.parametrize("n, shown", [
    (1 << 40, "1 TiB"), (3 << 39, "1.5 TiB"), (1024 << 40, "1024 TiB"),
    (1000 << 30, "1000 GiB"),  # 0.98 TiB reads worse
    (141 << 30, "141 GiB"), (512 << 20, "512 MiB"),
    ((512 << 20) - 40000, "511.96 MiB"),  # never "512.0 MiB": one figure, one way
    ((512 << 20) + 2048, "512 MiB"), ((1 << 30) - 1, "1 GiB"),
    (1 << 20, "1 MiB"), (1536, "1.5 KiB"), (0, "0 B"),
])
def test_sizes_read_in_the_largest_unit_without_a_misleading_decimal(n, shown):
    assert format_size(n) == shown
