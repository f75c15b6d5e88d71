"""Fits with their degrees of freedom (analyses.least_squares): a fit with no more points than
parameters is undetermined and said so; a determined one has 95% intervals."""
import math

import numpy as np
import pytest

from analyses.least_squares import LINE, POWER, Fit, fit_line, fit_log_log, fit_polynomial, fit_power, t_quantile


@pytest.mark.parametrize("dof, t", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (10, 2.2281), (30, 2.0423),
                                    (1000, 1.9623)])
def test_t_quantiles_are_the_tables(dof, t):
    assert t_quantile(0.975, dof) == pytest.approx(t, abs=1e-4)


@pytest.mark.parametrize("fit, points, parameters", [
    (lambda: fit_line([1, 2], [0.3, 0.9]), 2, 2),
    (lambda: fit_log_log([400, 2500], [81, 10000]), 2, 2),
    (lambda: fit_polynomial([1, 2, 4], [0.6, 0.7, 0.8], 2), 3, 3),
    (lambda: fit_power([1, 2, 4], [0.62, 0.71, 0.81]), 3, 3),  # the quick look's d_h sweep
])
def test_no_more_points_than_parameters_is_undetermined(fit, points, parameters):
    f = fit()
    assert not f.determined and f.dof == points - parameters <= 0
    assert f.get(f.names[0]) is None and f.interval(f.names[0]) is None
    assert f.show(f.names[0]) == f"undetermined ({points} points, {parameters} parameters)"
    assert f.to_json() == {"undetermined": True, "points": points, "parameters": parameters}


def test_a_log_log_fit_leaves_out_what_has_no_log():
    f = fit_log_log([8, 16, 32, 64], [0, 22, 56, 176])  # a size that stored nothing
    assert f.points == 3 and f.get("slope") == pytest.approx(fit_line(np.log([16, 32, 64]),
                                                                       np.log([22, 56, 176])).get("slope"))
    assert not fit_log_log([8, 16, 32], [0, 0, 5]).determined


def test_points_at_too_few_x_values_are_undetermined():
    f = fit_line([3, 3, 3], [1.0, 2.0, 4.0])  # three seeds of one size: no slope
    assert not f.determined and f.show("slope") == "undetermined (3 points at 1 x value, 2 parameters)"
    assert Fit.from_json(f.to_json(), LINE).show("slope") == f.show("slope")
    assert not fit_power([1, 1, 2, 2, 2], [0.1, 0.2, 0.3, 0.4, 0.5]).determined  # 3 parameters need 3 x values


def test_a_line_has_the_textbook_interval():
    rng = np.random.default_rng(0)
    x = np.arange(10.0)
    y = 0.5 + 0.2 * x + rng.normal(0, 0.1, 10)
    f = fit_line(x, y)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    se = math.sqrt((residual @ residual) / 8 / ((x - x.mean()) ** 2).sum())
    assert f.get("slope") == pytest.approx(slope) and f.dof == 8
    assert f.interval("slope") == pytest.approx((slope - 2.306 * se, slope + 2.306 * se), abs=1e-3 * se)
    assert f.interval("slope")[0] < 0.2 < f.interval("slope")[1]
    assert f.show("slope", ".3f") == f"{slope:.3f} [95% CI {f.interval('slope')[0]:.3f}, {f.interval('slope')[1]:.3f}]"
    assert Fit.from_json(f.to_json(), LINE) == f
    assert f.r2 == pytest.approx(1 - (residual @ residual) / ((y - y.mean()) ** 2).sum())


def test_the_power_fit_has_a_profile_interval_for_its_exponent():
    x = np.arange(1.0, 9.0)
    y = 0.1 + 0.02 * x ** 2 + np.array([0.01, -0.01, 0.02, -0.02, 0.01, -0.01, 0.0, 0.01])
    f = fit_power(x, y)
    low, high = f.interval("exponent")
    assert f.dof == 5 and low < 2.0 < high and high - low < 0.5
    assert f.to_json()["ci95"] == {"exponent": [low, high]}
    flat = fit_power(np.arange(1.0, 5.0), [0.5, 0.52, 0.49, 0.51])  # no trend: k unbounded on the grid
    assert flat.interval("exponent") == (-math.inf, math.inf)
    assert flat.to_json()["ci95"]["exponent"] == [None, None]
    assert Fit.from_json(flat.to_json(), POWER).interval("exponent") == (-math.inf, math.inf)
