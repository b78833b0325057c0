"""Configs shipped with hetspec; `hetspec-launch NAME` accepts their names."""
