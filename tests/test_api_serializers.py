"""The API's base serializers build their fields once per class and give every
serializer fields of its own, bound to it alone."""

from __future__ import annotations

from rest_framework import serializers

from chorus.api.serializers import StrictInput
from synthesis.api.serializers import JobOutput, SpeechCreateInput


class ListInput(StrictInput):
    names = serializers.ListField(child=serializers.CharField(max_length=3))
    count = serializers.IntegerField(min_value=1)


def test_each_input_serializer_has_its_own_fields_bound_to_it() -> None:
    first = SpeechCreateInput(data={"text": " Hello. ", "speed": 1.5})
    second = SpeechCreateInput(data={"text": "Bye.", "priority": "high"})

    assert first.is_valid(), first.errors
    assert second.is_valid(), second.errors

    for name, field in first.fields.items():
        other = second.fields[name]
        assert field is not other
        assert (field.parent, other.parent) == (first, second)
        assert field.field_name == other.field_name == name
    assert (first.validated_data["text"], first.validated_data["speed"]) == ("Hello.", 1.5)
    assert (second.validated_data["priority"], second.validated_data["speed"]) == ("high", 1.0)


def test_a_field_holding_another_gets_its_own_inner_field() -> None:
    first, second = ListInput(data={"names": ["ab"], "count": 1}), ListInput(data={})

    inner = [s.fields["names"].child for s in (first, second)]

    assert inner[0] is not inner[1]
    assert inner[0].parent is first.fields["names"]
    assert inner[1].parent is second.fields["names"]
    assert first.is_valid(), first.errors
    refused = ListInput(data={"names": ["abcd"], "count": 0})
    assert not refused.is_valid()
    assert set(refused.errors) == {"names", "count"}  # the validators still run


def test_a_validation_error_of_one_serializer_does_not_reach_the_next() -> None:
    refused = SpeechCreateInput(data={"text": "Hi.", "speed": 99})
    assert not refused.is_valid()

    accepted = SpeechCreateInput(data={"text": "Hi."})
    assert accepted.is_valid(), accepted.errors
    assert accepted.validated_data["speed"] == 1.0


def test_each_output_serializer_has_its_own_fields_bound_to_it() -> None:
    first, second = JobOutput(), JobOutput()

    for name, field in first.fields.items():
        assert field is not second.fields[name]
        assert field.parent is first
        assert second.fields[name].parent is second
