//! The dashboard: one page and its script and style sheet, compiled into the
//! binary (`node/ui/`), served by every node at `/ui`.
//!
//! The route is open: the page holds no data. Its script asks the operator for a
//! token (kept in the tab's `sessionStorage`), then calls the API of the node that
//! served it with `Authorization: Bearer …`, including the event stream, which it
//! reads with `fetch` (a browser's `EventSource` cannot send that header), so no
//! token ever travels in a URL. The Content-Security-Policy allows this origin
//! only: the page can neither load nor send anything elsewhere.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use permitd_core::contract::paths;

use permitd_core::contract::ErrorAnswer;

use crate::app::App;
use crate::edge::error::ApiError;

const PAGE: &str = include_str!("../../../ui/index.html");
const SCRIPT: &str = include_str!("../../../ui/app.js");
const STYLE: &str = include_str!("../../../ui/app.css");

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// `/ui` and `/ui/{asset}`.
pub fn router() -> Router<App> {
    Router::new()
        .route(paths::UI, get(page))
        .route(paths::UI_ASSET, get(asset))
}

/// `GET /ui`.
#[utoipa::path(
    get, path = paths::UI, tag = "operations",
    responses((status = 200, description = "The dashboard's page.", content_type = "text/html", body = String)),
)]
pub async fn page() -> Response {
    static_answer("text/html; charset=utf-8", PAGE)
}

/// `GET /ui/{asset}`.
#[utoipa::path(
    get, path = paths::UI_ASSET, tag = "operations",
    params(("asset" = String, Path, description = "`app.js`, `app.css` or `index.html`.")),
    responses(
        (status = 200, description = "The dashboard's script, style sheet or page, each with its own type.",
            content((String = "text/javascript"), (String = "text/css"), (String = "text/html"))),
        (status = 404, description = "No such asset.", body = ErrorAnswer),
    ),
)]
pub async fn asset(Path(name): Path<String>) -> Result<Response, ApiError> {
    match name.as_str() {
        "app.js" => Ok(static_answer("text/javascript; charset=utf-8", SCRIPT)),
        "app.css" => Ok(static_answer("text/css; charset=utf-8", STYLE)),
        "" | "index.html" => Ok(static_answer("text/html; charset=utf-8", PAGE)),
        _ => Err(ApiError::NotFound(format!("no dashboard asset {name}"))),
    }
}

fn static_answer(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}
