"""The object-storage settings of a run, checked before Snakemake uses them: one line per problem.

Snakemake's S3 storage plugin reads the endpoint when Snakemake makes its workflow object, before any line of this
workflow runs (an endpoint that is no URL, such as a placeholder left in, ends in 40 lines of botocore traceback),
and the credentials when the DAG is built (their absence shows as a resources expression that failed to evaluate,
under a hint about quoting). So `problems` says what is wrong first, one line each: `videogrpo check-storage`
before Snakemake (the README's steps run it first), and the workflow when it is read (a dry run too), for what
gets that far.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

# A bucket name: S3's rules are 3 to 63 lower-case letters, digits, dots and hyphens; older buckets and other stores
# allow capitals and underscores too, so only what no store takes (a placeholder's `<`, a space) is refused.
BUCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
ENDPOINT_VARIABLE = "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL"
KEYS_HOW = (
    "give the bucket's keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or SNAKEMAKE_STORAGE_S3_ACCESS_KEY and "
    "_SECRET_KEY, or ~/.aws/credentials), where the S3 plugin reads them"
)


def prefix_problem(prefix: str) -> str | None:
    parts = urlsplit(prefix)
    if parts.scheme != "s3":
        return f"--default-storage-prefix {prefix!r}: must be s3://<bucket>/<folder>"
    if not BUCKET_NAME.match(parts.netloc):
        return (
            f"--default-storage-prefix {prefix!r}: {parts.netloc!r} is no bucket name (letters, digits, dots, "
            f"hyphens); put your bucket's name there"
        )
    return None


def endpoint_problem(endpoint: str | None) -> str | None:
    if not endpoint:
        return None  # AWS S3 itself
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"[<>\s]", endpoint):
        return (
            f"{ENDPOINT_VARIABLE} (or --storage-s3-endpoint-url) = {endpoint!r}: no endpoint URL; give your S3 "
            f"service's, e.g. https://minio.example.org:9000, or unset it for AWS S3"
        )
    return None


def credentials_problem(access_key: str | None = None, secret_key: str | None = None) -> str | None:
    """None when the plugin finds keys: given to it (its settings, SNAKEMAKE_STORAGE_S3_*), or where boto3 looks."""
    if (access_key or os.environ.get("SNAKEMAKE_STORAGE_S3_ACCESS_KEY")) and (
        secret_key or os.environ.get("SNAKEMAKE_STORAGE_S3_SECRET_KEY")
    ):
        return None
    import boto3

    if boto3.session.Session().get_credentials() is not None:
        return None
    return f"object storage: no credentials for the bucket: {KEYS_HOW}"


def problems(
    prefix: str, endpoint: str | None, access_key: str | None = None, secret_key: str | None = None
) -> list[str]:
    """What is wrong with a run's object-storage settings, one line each; empty when nothing is."""
    found = [prefix_problem(prefix), endpoint_problem(endpoint), credentials_problem(access_key, secret_key)]
    return [problem for problem in found if problem]
