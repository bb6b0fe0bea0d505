//! The OpenAPI 3.1 document of the public API, built from the code itself.
//!
//! Schemas come from the wire types' `ToSchema` derives (core's `contract`,
//! `protocol`, `config`, …), operations from the `#[utoipa::path]` attributes
//! on the handlers, whose paths are the constants of
//! [`permitd_core::contract::paths`]. What every operation shares is added
//! here, by rule, so that no handler repeats it:
//!
//! - the bearer scheme, on every route [`action_of`] does not call open;
//! - the error answers ([`ErrorAnswer`], status from [`ErrorCode::status`]):
//!   401 and 403 where a token is checked, 400/413/415 where a body is read,
//!   400/404 where a path parameter is, 400 where a query is, 500 and 503
//!   everywhere; 429 and 503 carry `Retry-After`.
//!
//! The document is checked in as `docs/openapi.json`; a test regenerates it and
//! compares (`PERMITD_WRITE_OPENAPI=1` rewrites the file).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use axum::http::{header, Method};
use axum::response::IntoResponse;
use permitd_core::contract::{paths, ErrorAnswer, ErrorCode};
use utoipa::openapi::header::{Header, HeaderBuilder};
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::edge::auth::roles::action_of;

mod limits;

/// The name of the bearer scheme in `components.securitySchemes`.
const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "permitd",
        description = "A replicated semaphore service: the public HTTP API of one node. \
            Every node serves every route; calls that need the leader are forwarded to it. \
            docs/protocol.md explains every field.",
        license(name = "MIT OR Apache-2.0"),
    ),
    paths(
        super::semaphores::list,
        super::semaphores::post,
        super::batch::post,
        super::semaphores::usage,
        super::semaphores::get_config,
        super::semaphores::put_config,
        super::semaphores::put_group,
        super::semaphores::delete_group,
        super::holders::get,
        super::holders::force_release,
        super::delete_key::delete_key,
        super::event_stream::stream,
        super::ui::page,
        super::ui::asset,
        super::cluster::status,
        super::cluster::shards,
        super::cluster::init,
        super::cluster::members,
        super::cluster::put_defaults,
        crate::edge::api::tokens::create,
        crate::edge::api::tokens::list,
        crate::edge::api::tokens::revoke,
        super::backup::save,
        super::backup::restore,
        super::metrics,
        super::healthz,
        super::readyz,
        document,
    ),
    components(schemas(ErrorAnswer)),
    modifiers(&SharedAnswers),
)]
struct ApiDoc;

/// The document, built once per process.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    text.push('\n');
    text
});

/// The document as pretty JSON with a final newline: what `GET /openapi.json`
/// answers and `docs/openapi.json` holds.
pub fn document_json() -> &'static str {
    &DOCUMENT
}

/// `GET /openapi.json`.
#[utoipa::path(
    get, path = paths::OPENAPI, tag = "operations",
    responses((status = 200, description = "This document.", content_type = "application/json", body = Object)),
)]
pub async fn document() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
}

/// Adds what every operation shares: security and the error answers.
struct SharedAnswers;

impl Modify for SharedAnswers {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "An API token (`pmt_…`) or the admin token of the config file.",
            ))
            .build();
        components.add_security_scheme(BEARER, SecurityScheme::Http(bearer));
        components
            .schemas
            .entry(ErrorAnswer::name().into_owned())
            .or_insert_with(ErrorAnswer::schema);
        open_flattened_parts(&mut components.schemas);
        limits::apply(&mut components.schemas);
        let statuses: BTreeSet<u16> = ErrorCode::ALL.into_iter().map(ErrorCode::status).collect();
        for status in statuses {
            components
                .responses
                .insert(error_response_name(status), error_response(status));
        }
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                (Method::GET, &mut item.get),
                (Method::PUT, &mut item.put),
                (Method::POST, &mut item.post),
                (Method::DELETE, &mut item.delete),
            ];
            for (method, operation) in operations {
                if let Some(operation) = operation {
                    let open = action_of(&method, path, None).is_none();
                    add_shared(operation, open);
                }
            }
        }
    }
}

/// A response that flattens a request type refusing unknown fields (a token's
/// record flattens its `TokenSpec`) holds that type's fields *and* its own: in
/// the `allOf`, the part is inlined without `additionalProperties: false`, which
/// would refuse the record's other fields.
fn open_flattened_parts(schemas: &mut BTreeMap<String, RefOr<Schema>>) {
    let closed: BTreeMap<String, RefOr<Schema>> = schemas
        .iter()
        .filter_map(|(name, schema)| match schema {
            RefOr::T(Schema::Object(object)) if object.additional_properties.is_some() => {
                let mut open = object.clone();
                open.additional_properties = None;
                Some((
                    format!("#/components/schemas/{name}"),
                    Schema::Object(open).into(),
                ))
            }
            _ => None,
        })
        .collect();
    for schema in schemas.values_mut() {
        if let RefOr::T(Schema::AllOf(all_of)) = schema {
            for part in &mut all_of.items {
                if let RefOr::Ref(reference) = part {
                    if let Some(open) = closed.get(&reference.ref_location) {
                        *part = open.clone();
                    }
                }
            }
        }
    }
}

/// The security requirement and error answers of one operation.
fn add_shared(operation: &mut Operation, open: bool) {
    let mut codes = vec![ErrorCode::Internal, ErrorCode::NoQuorum];
    if !open {
        operation.security = Some(vec![SecurityRequirement::new::<_, _, &str>(BEARER, [])]);
        codes.extend([ErrorCode::Unauthorized, ErrorCode::Forbidden]);
    }
    for parameter in operation.parameters.iter_mut().flatten() {
        let rule = limits::parameter(&parameter.name);
        if let (Some(rule), Some(schema)) = (rule, parameter.schema.as_mut()) {
            limits::constrain(schema, rule);
        }
    }
    let parameters = operation.parameters.as_deref().unwrap_or_default();
    let has = |place: ParameterIn| parameters.iter().any(|p| p.parameter_in == place);
    if has(ParameterIn::Path) {
        codes.extend([ErrorCode::BadRequest, ErrorCode::NotFound]);
    }
    if has(ParameterIn::Query) {
        codes.push(ErrorCode::BadRequest);
    }
    if operation.request_body.is_some() {
        codes.extend([
            ErrorCode::BadRequest,
            ErrorCode::PayloadTooLarge,
            ErrorCode::UnsupportedMediaType,
        ]);
    }
    let responses = &mut operation.responses.responses;
    for code in codes {
        let status = code.status();
        let shared = format!("#/components/responses/{}", error_response_name(status));
        responses
            .entry(status.to_string())
            .or_insert_with(|| Ref::new(shared).into());
    }
    // A handler's own 429 (say `too_many_pending`) carries the header too.
    for (status, response) in responses.iter_mut() {
        if let (RefOr::T(response), true) = (response, retries(status)) {
            let name = header::RETRY_AFTER.as_str().to_owned();
            response.headers.entry(name).or_insert_with(retry_after);
        }
    }
}

/// Whether answers of `status` carry `Retry-After` ([`ErrorCode::retry_after`]).
fn retries(status: &str) -> bool {
    ErrorCode::ALL
        .into_iter()
        .any(|code| code.retry_after() && code.status().to_string() == status)
}

fn retry_after() -> Header {
    HeaderBuilder::new()
        .schema(u64::schema())
        .description(Some("Seconds to wait before asking again."))
        .build()
}

/// The name in `components.responses` of the error answer for `status`.
fn error_response_name(status: u16) -> String {
    format!("Error{status}")
}

/// An error answer for `status`, listing the codes sent with it.
fn error_response(status: u16) -> RefOr<Response> {
    let codes: Vec<&str> = ErrorCode::ALL
        .into_iter()
        .filter(|code| code.status() == status)
        .map(ErrorCode::as_str)
        .collect();
    let description = format!("An error answer: `{}`.", codes.join("`, `"));
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name(ErrorAnswer::name())))
        .build();
    let mut response = ResponseBuilder::new()
        .description(description)
        .content("application/json", content);
    if retries(&status.to_string()) {
        response = response.header(header::RETRY_AFTER.as_str(), retry_after());
    }
    response.build().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_an_operation_with_its_errors() {
        let doc: serde_json::Value = serde_json::from_str(document_json()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        for path in paths::ALL {
            let item = &doc["paths"][path];
            assert!(item.is_object(), "{path} is missing from the document");
            for (method, operation) in item.as_object().unwrap() {
                let responses = &operation["responses"];
                assert!(responses["500"].is_object(), "{method} {path} lacks 500");
                let secured = operation.get("security").is_some();
                let open = matches!(
                    path,
                    paths::HEALTHZ | paths::READYZ | paths::OPENAPI | paths::UI | paths::UI_ASSET
                );
                assert_eq!(secured, !open, "{method} {path}: security");
                assert_eq!(responses["401"].is_object(), !open, "{method} {path}: 401");
            }
        }
        let schemes = &doc["components"]["securitySchemes"][BEARER];
        assert_eq!(schemes["scheme"], "bearer");
    }

    /// `docs/openapi.json` is this build's document, byte for byte. After a
    /// change to a route or a wire type, rewrite it with
    /// `PERMITD_WRITE_OPENAPI=1 cargo test -p permitd --lib openapi` and commit it.
    #[test]
    fn the_checked_in_document_is_current() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        if std::env::var_os("PERMITD_WRITE_OPENAPI").is_some() {
            std::fs::write(file, document_json()).expect("docs/openapi.json is writable");
        }
        let checked_in = std::fs::read_to_string(file).unwrap_or_default();
        assert!(
            checked_in == document_json(),
            "docs/openapi.json differs from the code's document: rewrite it with \
             PERMITD_WRITE_OPENAPI=1 cargo test -p permitd --lib openapi"
        );
    }

    #[test]
    fn unavailable_answers_document_retry_after() {
        let doc: serde_json::Value = serde_json::from_str(document_json()).unwrap();
        let post = &doc["paths"][paths::SEMAPHORE]["post"]["responses"];
        // A shared answer is a `$ref` into `components.responses`.
        let resolve = |response: &serde_json::Value| match response["$ref"].as_str() {
            Some(location) => {
                let name = location.rsplit('/').next().unwrap();
                doc["components"]["responses"][name].clone()
            }
            None => response.clone(),
        };
        assert!(resolve(&post["503"])["headers"]["retry-after"].is_object());
        assert!(resolve(&post["429"])["headers"]["retry-after"].is_object());
        assert!(resolve(&post["400"])["content"]["application/json"].is_object());
        assert!(resolve(&post["400"])["headers"].is_null());
    }
}
