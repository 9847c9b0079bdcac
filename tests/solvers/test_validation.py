"""The shared field checks (atoll.solvers.validation): a valid value comes back as given; an invalid
one is the owner's error naming the owner, the field, what is valid and the value."""

import pytest

from atoll.control.plans import SinkError
from atoll.solvers.errors import InputError
from atoll.solvers.validation import check_day_range, check_flag, check_port


def test_a_flag_is_a_bool_only() -> None:
    assert check_flag("O", "on", True) is True and check_flag("O", "on", False) is False
    for bad in (1, 0, None, "yes"):
        with pytest.raises(InputError, match=f"O: field 'on' must be True or False, got {bad!r}"):
            check_flag("O", "on", bad)


def test_a_day_range_is_two_whole_days_in_order() -> None:
    assert check_day_range("O", "days", (1, 1)) == (1, 1) and check_day_range("O", "days", [4, 10]) == [4, 10]
    for bad in ((0, 3), (4, 3), (1, 2, 3), (1.0, 2), (True, 2), 5, None):
        with pytest.raises(InputError, match=r"O: field 'days' must be \(first, last\) with 1 <= first"):
            check_day_range("O", "days", bad)


def test_a_port_is_an_integer_in_range_and_zero_only_when_any_free_port_will_do() -> None:
    assert check_port("O", "port", 65535) == 65535 and check_port("O", "port", 0, any_free=True) == 0
    with pytest.raises(InputError, match=r"O: field 'port' must be an integer in 1\.\.65535, got 0"):
        check_port("O", "port", 0)
    with pytest.raises(SinkError, match=r"in 0\.\.65535 \(0: any free port\), got 70000"):
        check_port("O", "port", 70000, any_free=True, error=SinkError)
    with pytest.raises(InputError, match="got True"):
        check_port("O", "port", True)
