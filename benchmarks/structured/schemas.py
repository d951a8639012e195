"""Schemas for the structured-output benchmarks, written here (JSONSchemaBench-style kinds,
not its files): a 20-property schema with a matching instance, and a coverage set of
60 schemas (nested objects, arrays with min/max items, enums, patterns, bounded
numbers, anyOf, $ref, formats) plus 6 that must be refused (keywords llguidance does
not implement, and an unsatisfiable schema)."""

from __future__ import annotations

import copy


def twenty_properties(tag: str = "") -> dict:
    """20 properties of mixed kinds; `tag` renames them so each tag is a new schema (no cache hit)."""
    p = {
        "id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "height_m": {"type": "number", "minimum": 0.3, "maximum": 2.8},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 5},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"type": "string", "enum": ["FR", "DE", "US", "JP", "BR"]},
        "created": {"type": "string", "format": "date"},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 40},
                                                     "city": {"type": "string", "maxLength": 30}},
                    "required": ["street", "city"], "additionalProperties": False},
        "phone": {"type": ["string", "null"], "pattern": "^\\+?[0-9 ]{6,15}$"},
        "level": {"type": "integer", "enum": [1, 2, 3]},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]},
        "ratios": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 4},
        "verified": {"type": "boolean"},
        "notes": {"type": "string", "maxLength": 80},
        "priority": {"enum": ["low", "medium", "high"]},
    }
    props = {f"{k}{tag}": v for k, v in p.items()}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def twenty_instance(tag: str = "") -> dict:
    """A valid instance of twenty_properties(tag)."""
    v = {"id": 42, "name": "Ada Lovelace", "email": "ada@example.com", "age": 36, "height_m": 1.65,
         "active": True, "role": "admin", "tags": ["math", "engines"], "zip": "75001", "country": "FR",
         "created": "2024-05-01", "score": 97.5, "address": {"street": "1 Rue de Rivoli", "city": "Paris"},
         "phone": "+33 1 23 45 67", "level": 2, "nickname": None, "ratios": [0.25, 0.5], "verified": False,
         "notes": "first programmer", "priority": "high"}
    return {f"{k}{tag}": x for k, x in v.items()}


def coverage_set() -> list[tuple[str, dict]]:
    """(name, schema) pairs; every one uses only keywords llguidance implements, except
    those named `refused-*`, which the engine must refuse (not ignore)."""
    s: list[tuple[str, dict]] = []
    add = lambda name, schema: s.append((name, schema))  # noqa: E731
    # scalars
    add("string", {"type": "string", "maxLength": 30})
    add("string-min-max", {"type": "string", "minLength": 3, "maxLength": 10})
    add("integer", {"type": "integer"})
    add("integer-bounded", {"type": "integer", "minimum": -50, "maximum": 50})
    add("integer-exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})
    add("number-bounded", {"type": "number", "minimum": 0, "maximum": 1})
    add("boolean", {"type": "boolean"})
    add("null", {"type": "null"})
    add("enum-strings", {"enum": ["red", "green", "blue"]})
    add("enum-mixed", {"enum": ["a", 1, None, True]})
    add("const", {"const": "fixed"})
    add("type-union", {"type": ["integer", "string"], "maxLength": 8})
    # patterns and formats
    add("pattern-date", {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"})
    add("pattern-code", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"})
    add("pattern-hex", {"type": "string", "pattern": "^#[0-9a-f]{6}$"})
    add("format-date", {"type": "string", "format": "date"})
    add("format-time", {"type": "string", "format": "time"})
    add("format-date-time", {"type": "string", "format": "date-time"})
    add("format-email", {"type": "string", "format": "email"})
    add("format-uuid", {"type": "string", "format": "uuid"})
    add("format-ipv4", {"type": "string", "format": "ipv4"})
    # objects
    obj = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
           "required": ["name", "age"], "additionalProperties": False}
    add("object", obj)
    add("object-optional", {**obj, "required": ["name"]})
    add("object-open", {**obj, "additionalProperties": True})
    add("object-additional-typed", {"type": "object", "additionalProperties": {"type": "integer"},
                                    "maxProperties": 3})
    add("object-nested", {"type": "object", "properties": {"person": obj, "city": {"type": "string",
                                                                                   "maxLength": 20}},
                          "required": ["person", "city"], "additionalProperties": False})
    add("object-deep", {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "integer", "maximum": 9, "minimum": 0}},
              "required": ["c"], "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
        "required": ["a"], "additionalProperties": False})
    add("object-min-properties", {"type": "object", "properties": {"x": {"type": "integer"},
                                                                   "y": {"type": "integer"}},
                                  "minProperties": 1, "additionalProperties": False})
    add("object-pattern-properties", {"type": "object", "patternProperties": {"^n_[a-z]+$": {"type": "number"}},
                                      "additionalProperties": False, "maxProperties": 3})
    add("object-empty", {"type": "object", "properties": {}, "additionalProperties": False})
    # arrays
    add("array-ints", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                       "minItems": 2, "maxItems": 5})
    add("array-strings", {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4})
    add("array-exact", {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3})
    add("array-objects", {"type": "array", "items": obj, "minItems": 1, "maxItems": 3})
    add("array-enum", {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 1, "maxItems": 6})
    add("array-tuple", {"type": "array", "prefixItems": [{"type": "string", "maxLength": 8},
                                                         {"type": "integer", "maximum": 9, "minimum": 0}],
                        "items": False})
    add("array-nested", {"type": "array", "items": {"type": "array", "items": {"type": "integer", "maximum": 9,
                                                                               "minimum": 0},
                                                    "maxItems": 3}, "maxItems": 3})
    # combinators and references
    add("anyOf-scalars", {"anyOf": [{"type": "integer", "maximum": 100, "minimum": 0}, {"type": "boolean"}]})
    add("anyOf-objects", {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0,
                                                                             "maximum": 10}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0,
                                                                                "maximum": 10}},
         "required": ["kind", "side"], "additionalProperties": False}]})
    add("oneOf", {"oneOf": [{"type": "string", "maxLength": 5}, {"type": "integer"}]})
    add("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                     "maximum": 9}}, "required": ["a"]},
                            {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]})
    add("nullable", {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]})
    defs = {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9,
                                                                       "maximum": 9},
                                                                 "y": {"type": "integer", "minimum": -9,
                                                                       "maximum": 9}},
                                "required": ["x", "y"], "additionalProperties": False}}}
    add("ref-defs", {**defs, "type": "object", "properties": {"a": {"$ref": "#/$defs/point"},
                                                              "b": {"$ref": "#/$defs/point"}},
                     "required": ["a", "b"], "additionalProperties": False})
    add("ref-array", {**defs, "type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3})
    add("ref-definitions", {"definitions": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
                            "type": "object", "properties": {"id": {"$ref": "#/definitions/id"}},
                            "required": ["id"], "additionalProperties": False})
    add("ref-recursive", {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"})
    add("ref-root", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                      "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                     "required": ["name", "next"], "additionalProperties": False})
    # realistic ones
    add("event", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "date": {"type": "string", "format": "date"},
        "attendees": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 4},
        "online": {"type": "boolean"}}, "required": ["title", "date", "attendees", "online"],
        "additionalProperties": False})
    add("product", {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"}, "price": {"type": "number", "minimum": 0,
                                                                           "maximum": 10000},
        "currency": {"enum": ["EUR", "USD", "JPY"]}, "stock": {"type": "integer", "minimum": 0, "maximum": 1000}},
        "required": ["sku", "price", "currency", "stock"], "additionalProperties": False})
    add("sentiment", {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                                                       "confidence": {"type": "number", "minimum": 0,
                                                                      "maximum": 1}},
                      "required": ["label", "confidence"], "additionalProperties": False})
    add("tool-call", {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}, "required": ["name", "arguments"],
        "additionalProperties": False})
    add("address", {"type": "object", "properties": {
        "street": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 30},
        "postcode": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"type": "string", "minLength": 2,
                                                                            "maxLength": 2}},
        "required": ["street", "city", "postcode", "country"], "additionalProperties": False})
    add("matrix", {"type": "object", "properties": {"rows": {"type": "integer", "minimum": 1, "maximum": 3},
                                                    "data": {"type": "array", "items": {
                                                        "type": "array", "items": {"type": "number",
                                                                                   "minimum": -1, "maximum": 1},
                                                        "minItems": 2, "maxItems": 2},
                                                        "minItems": 1, "maxItems": 3}},
                   "required": ["rows", "data"], "additionalProperties": False})
    add("log-entry", {"type": "object", "properties": {
        "level": {"enum": ["debug", "info", "warning", "error"]}, "message": {"type": "string", "maxLength": 60},
        "code": {"type": ["integer", "null"], "minimum": 100, "maximum": 599}},
        "required": ["level", "message", "code"], "additionalProperties": False})
    add("twenty-properties", twenty_properties())
    add("recipe", {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30},
        "ingredients": {"type": "array", "items": {"type": "object", "properties": {
            "item": {"type": "string", "maxLength": 20}, "grams": {"type": "integer", "minimum": 1,
                                                                   "maximum": 1000}},
            "required": ["item", "grams"], "additionalProperties": False}, "minItems": 1, "maxItems": 4},
        "vegetarian": {"type": "boolean"}}, "required": ["name", "ingredients", "vegetarian"],
        "additionalProperties": False})
    add("any", {})
    add("any-object", {"type": "object"})
    add("string-enum-long", {"enum": [f"option_{i}" for i in range(50)]})
    add("description-annotations", {"type": "object", "title": "T", "description": "annotations are ignored "
                                    "by design in JSON Schema", "properties": {"a": {"type": "integer", "default": 1,
                                                                                  "examples": [1], "minimum": 0,
                                                                                  "maximum": 5}},
                                    "required": ["a"], "additionalProperties": False})
    # keywords llguidance does not implement: refused with a message naming them
    add("refused-uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    add("refused-not", {"not": {"type": "string"}})
    add("refused-if-then", {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}})
    add("refused-contains", {"type": "array", "contains": {"type": "integer"}})
    add("refused-dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}})
    # ... and a schema no value satisfies (additionalProperties does not see allOf's properties)
    add("refused-unsatisfiable", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                                             "required": ["a"]}], "additionalProperties": False})
    return [(n, copy.deepcopy(x)) for n, x in s]
