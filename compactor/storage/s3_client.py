"""A boto3 S3 client for a table's FileIO, where pyarrow's file system does not offer the call."""

from __future__ import annotations

from typing import Any

from pyiceberg.io import (
    AWS_ACCESS_KEY_ID,
    AWS_REGION,
    AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN,
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
    FileIO,
)
from pyiceberg.utils.properties import get_first_property_value

S3_SCHEMES = {"s3", "s3a", "s3n"}


def s3_client(io: FileIO) -> Any | None:
    """A boto3 S3 client configured like the table's FileIO, or None without boto3.

    Credentials and region are looked up as pyiceberg's S3 FileIO does: ``s3.*`` first, then
    the ``client.*`` properties shared by all AWS clients.
    """
    try:
        import boto3
    except ImportError:
        return None
    props = io.properties
    return boto3.client(
        "s3",
        endpoint_url=props.get(S3_ENDPOINT),
        aws_access_key_id=get_first_property_value(props, S3_ACCESS_KEY_ID, AWS_ACCESS_KEY_ID),
        aws_secret_access_key=get_first_property_value(
            props, S3_SECRET_ACCESS_KEY, AWS_SECRET_ACCESS_KEY
        ),
        aws_session_token=get_first_property_value(props, S3_SESSION_TOKEN, AWS_SESSION_TOKEN),
        region_name=get_first_property_value(props, S3_REGION, AWS_REGION),
    )
