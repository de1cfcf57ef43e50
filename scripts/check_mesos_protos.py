"""Compare mesolite's Mesos proto subset with Apache Mesos' own protos: 0 diffs expected.

    python scripts/check_mesos_protos.py MESOS_CHECKOUT

MESOS_CHECKOUT is a Mesos source tree (or any folder holding
`include/mesos/v1/mesos.proto` and `include/mesos/v1/scheduler/scheduler.proto`).
Every message, field and enum value of protos/mesolite/v1/mesos/ must exist in
Mesos under the same name, with the same field number, type (the same message or
enum, by its name inside the package) and cardinality (repeated or not; Mesos'
`required` is `optional` here, the same on the wire). Prints each difference and
exits 1 if there is one. Not part of CI: it needs a Mesos checkout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
OURS = ("mesolite/v1/mesos/mesos.proto", "mesolite/v1/mesos/scheduler.proto")
THEIRS = ("mesos/v1/mesos.proto", "mesos/v1/scheduler/scheduler.proto")
OUR_PACKAGE = "mesolite.v1.mesos"
THEIR_PACKAGES = ("mesos.v1.scheduler", "mesos.v1")

F = descriptor_pb2.FieldDescriptorProto


def descriptors(include: Path, files: tuple[str, ...]) -> descriptor_pb2.FileDescriptorSet:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{include}"]
        cmd += ["--include_imports", f"--descriptor_set_out={out}", *files]
        subprocess.run(cmd, check=True)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


Types = dict[str, descriptor_pb2.DescriptorProto | descriptor_pb2.EnumDescriptorProto]


def types_of(files: descriptor_pb2.FileDescriptorSet, packages: tuple[str, ...]) -> Types:
    """Every message and enum, by its name inside its package ("Offer.Operation")."""
    found: Types = {}

    def add_message(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}{message.name}"
        found[name] = message
        for nested in message.nested_type:
            add_message(f"{name}.", nested)
        for enum in message.enum_type:
            found[f"{name}.{enum.name}"] = enum

    for file in files.file:
        if file.package not in packages:
            continue
        for message in file.message_type:
            add_message("", message)
        for enum in file.enum_type:
            found[enum.name] = enum
    return found


def local(type_name: str, packages: tuple[str, ...]) -> str:
    """A field's type name without its package: ".mesos.v1.Offer" -> "Offer"."""
    name = type_name.lstrip(".")
    for package in packages:
        if name.startswith(package + "."):
            return name[len(package) + 1 :]
    return name


def compare(ours: Types, theirs: Types) -> list[str]:
    diffs = []
    for name, our in sorted(ours.items()):
        their = theirs.get(name)
        if their is None:
            diffs.append(f"{name}: not in Mesos")
            continue
        if isinstance(our, descriptor_pb2.EnumDescriptorProto):
            if not isinstance(their, descriptor_pb2.EnumDescriptorProto):
                diffs.append(f"{name}: an enum here, not in Mesos")
                continue
            values = {v.name: v.number for v in their.value}
            for v in our.value:
                if values.get(v.name) != v.number:
                    diffs.append(f"{name}.{v.name} = {v.number}; Mesos: {values.get(v.name)}")
            continue
        if not isinstance(their, descriptor_pb2.DescriptorProto):
            diffs.append(f"{name}: a message here, not in Mesos")
            continue
        fields = {f.number: f for f in their.field}
        for f in our.field:
            t = fields.get(f.number)
            where = f"{name}.{f.name} = {f.number}"
            if t is None:
                diffs.append(f"{where}: no field {f.number} in Mesos")
                continue
            if t.name != f.name:
                diffs.append(f"{where}: Mesos names it {t.name}")
            if t.type != f.type:
                diffs.append(f"{where}: type {F.Type.Name(f.type)}; Mesos: {F.Type.Name(t.type)}")
            elif f.type_name and local(f.type_name, (OUR_PACKAGE,)) != local(
                t.type_name, THEIR_PACKAGES
            ):
                diffs.append(f"{where}: type {f.type_name}; Mesos: {t.type_name}")
            if (f.label == F.LABEL_REPEATED) != (t.label == F.LABEL_REPEATED):
                diffs.append(f"{where}: repeated differs from Mesos")
    return diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mesos", type=Path, help="a Mesos source tree")
    args = parser.parse_args()
    ours = types_of(descriptors(ROOT / "protos", OURS), (OUR_PACKAGE,))
    theirs = types_of(descriptors(args.mesos / "include", THEIRS), THEIR_PACKAGES)
    diffs = compare(ours, theirs)
    for diff in diffs:
        print(diff)
    fields = sum(
        len(t.field) for t in ours.values() if isinstance(t, descriptor_pb2.DescriptorProto)
    )
    print(f"{len(ours)} types, {fields} fields compared with Mesos: {len(diffs)} diffs")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
