#!/usr/bin/env python3
"""Kubernetes OpenAPI v2 (swagger.json) -> kubeconform's standalone strict JSON schemas.

usage: openapi2jsonschema.py SWAGGER.json OUTDIR
Writes OUTDIR/<kind>-<group>-<version>.json (core group: <kind>-<version>.json), the names
kubeconform asks for with -schema-location 'OUTDIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'.
"standalone": every $ref is inlined (a recursive one, such as a CRD's JSONSchemaProps, becomes
{} at its second appearance); "strict": objects with declared properties accept no others.
IntOrString and Quantity accept a string or a number, as the API server does.
"""
import json, os, sys

SPECIAL = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"oneOf": [{"type": "string"}, {"type": "number"}]},
}


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        defs = json.load(f)["definitions"]

    def resolve(node, stack):
        if isinstance(node, list):
            return [resolve(n, stack) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            if name in SPECIAL:
                return dict(SPECIAL[name])
            if name in stack:
                return {}
            return resolve(defs[name], stack + (name,))
        if node.get("format") == "int-or-string":
            return dict(SPECIAL["io.k8s.apimachinery.pkg.util.intstr.IntOrString"])
        r = {}
        for k, v in node.items():
            if k.startswith("x-kubernetes-") and k != "x-kubernetes-group-version-kind":
                continue
            if k == "properties":
                r[k] = {p: resolve(s, stack) for p, s in v.items()}
            else:
                r[k] = resolve(v, stack)
        if "properties" in r and "additionalProperties" not in r:
            r["additionalProperties"] = False
        return r

    os.makedirs(out, exist_ok=True)
    n = 0
    for name, d in sorted(defs.items()):
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            kind, group, version = gvk["kind"], gvk["group"], gvk["version"]
            suffix = "-" + (group.split(".")[0] + "-" if group else "") + version
            schema = resolve(d, (name,))
            schema.pop("x-kubernetes-group-version-kind", None)
            schema["$schema"] = "http://json-schema.org/schema#"
            # apiVersion and kind must name this very type
            props = schema.get("properties", {})
            if "apiVersion" in props:
                props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version}" if group else version]}
            if "kind" in props:
                props["kind"] = {"type": "string", "enum": [kind]}
            path = os.path.join(out, f"{kind.lower()}{suffix.lower()}.json")
            with open(path, "w") as f:
                json.dump(schema, f, sort_keys=True)
            n += 1
    print(f"wrote {n} schemas to {out}")


if __name__ == "__main__":
    main()
