//! SQS errors, with the codes of both wire protocols: the JSON protocol's
//! `__type` shape name and the query protocol's legacy code (sent to JSON
//! clients too, in `x-amzn-query-error`, as SQS does).

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SqsError {
    /// Shape name of the JSON protocol, e.g. `QueueDoesNotExist`.
    pub shape: &'static str,
    /// Code of the query protocol, e.g. `AWS.SimpleQueueService.NonExistentQueue`.
    pub code: &'static str,
    pub message: String,
    /// The client's fault (4xx) or the service's (5xx).
    pub sender_fault: bool,
    pub status: u16,
}

/// Each client error's HTTP status is the one AWS's service model gives it
/// (400 unless named).
macro_rules! status {
    () => {
        400
    };
    ($status:literal) => {
        $status
    };
}

macro_rules! errors {
    ($($fn:ident => $shape:literal, $code:literal $(, $status:literal)?;)*) => {
        impl SqsError {
            $(
                pub fn $fn(message: impl Into<String>) -> Self {
                    Self {
                        shape: $shape,
                        code: $code,
                        message: message.into(),
                        sender_fault: true,
                        status: status!($($status)?),
                    }
                }
            )*

            /// Every (shape, code) of the errors above, for [`SqsError::from_wire`].
            const KNOWN: &[(&'static str, &'static str)] = &[$(($shape, $code)),*];
        }
    };
}

errors! {
    queue_does_not_exist => "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue";
    queue_name_exists => "QueueNameExists", "QueueAlreadyExists";
    invalid_parameter_value => "InvalidParameterValueException", "InvalidParameterValue";
    missing_parameter => "MissingParameter", "MissingParameter";
    invalid_attribute_name => "InvalidAttributeName", "InvalidAttributeName";
    invalid_attribute_value => "InvalidAttributeValue", "InvalidAttributeValue";
    invalid_message_contents => "InvalidMessageContents", "InvalidMessageContents";
    receipt_handle_is_invalid => "ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 404;
    message_not_inflight => "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight";
    too_many_entries => "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest";
    empty_batch => "EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest";
    batch_ids_not_distinct => "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct";
    invalid_batch_entry_id => "InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId";
    batch_request_too_long => "BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong";
    unsupported_operation => "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation";
    invalid_action => "InvalidAction", "InvalidAction";
    malformed_request => "MalformedQueryString", "MalformedQueryString";
    over_limit => "OverLimit", "OverLimit", 403;
    request_throttled => "RequestThrottled", "RequestThrottled", 403;
    purge_queue_in_progress => "PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress", 403;
    queue_deleted_recently => "QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently";
    resource_not_found => "ResourceNotFoundException", "ResourceNotFoundException", 404;
    access_denied => "AccessDenied", "AccessDenied";
    invalid_client_token_id => "InvalidClientTokenId", "InvalidClientTokenId";
    signature_does_not_match => "SignatureDoesNotMatch", "SignatureDoesNotMatch";
    content_sha256_mismatch => "XAmzContentSHA256Mismatch", "XAmzContentSHA256Mismatch";
    missing_authentication_token => "MissingAuthenticationToken", "MissingAuthenticationToken";
}

impl SqsError {
    /// A 403 for authentication and authorisation failures.
    pub fn forbidden(self) -> Self {
        Self { status: 403, ..self }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            shape: "InternalError",
            code: "InternalError",
            message: message.into(),
            sender_fault: false,
            status: 500,
        }
    }

    /// The error another replica answered (see [`Wire`]); a shape this
    /// version does not know is its internal error.
    pub fn from_wire(wire: Wire) -> Self {
        let known = Self::KNOWN
            .iter()
            .chain(
                [
                    ("InternalError", "InternalError"),
                    ("ServiceUnavailable", "ServiceUnavailable"),
                ]
                .iter(),
            )
            .find(|(shape, _)| *shape == wire.shape);
        match known {
            Some((shape, code)) => Self {
                shape,
                code,
                message: wire.message,
                sender_fault: wire.sender_fault,
                status: wire.status,
            },
            None => Self::internal(wire.message),
        }
    }

    pub fn to_wire(&self) -> Wire {
        Wire {
            shape: self.shape.to_owned(),
            message: self.message.clone(),
            sender_fault: self.sender_fault,
            status: self.status,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            shape: "ServiceUnavailable",
            code: "ServiceUnavailable",
            message: message.into(),
            sender_fault: false,
            status: 503,
        }
    }
}

/// An error as one replica answers it to another.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Wire {
    pub shape: String,
    pub message: String,
    pub sender_fault: bool,
    pub status: u16,
}
