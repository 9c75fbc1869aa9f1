"""The predictor counts the family forecasts of each answer, by whether the
model knew the family."""
from __future__ import annotations

from speckv.services.predictor.server import forecast_rows
from speckv.v1 import predictor_pb2 as pb


def test_rows_split_by_known():
    response = pb.ForecastResponse(forecasts=[pb.FamilyForecast(family="a", known=True),
                                              pb.FamilyForecast(family="b", known=False),
                                              pb.FamilyForecast(family="c", known=True)])
    assert forecast_rows(response) == {"true": 2, "false": 1}
    assert forecast_rows(pb.ForecastResponse()) == {"true": 0, "false": 0}
