//! serve's kept sessions' tool records are rows of its store (`StoreRecords`), so that every
//! serve on one store sees the same ones. Earlier versions kept them as files in the data
//! directory (`<data>/runs/sessions/<id>.<kind>.json`, `FileRecords`), as the CLI still
//! does. At start, before the reconcile, serve moves the files of the sessions its store
//! names into the store, then sweeps the files of sessions that have no sandbox (as its
//! start always did); the files of a CLI's kept session whose sandbox runs stay, the CLI's.
//!
//! The move is idempotent: a record the store already holds wins over its file (a move cut
//! short after the store's write), and a file is deleted only once the store holds it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::sandbox::records::{FileRecords, SessionRecords};
use sandboxd_core::store::Store;

/// What the start did with the data directory's record files.
#[derive(Debug, Default)]
pub(crate) struct FilesAdopted {
    /// (session, kind) moved into the store.
    pub(crate) moved: Vec<(String, String)>,
    /// Sessions without a sandbox whose files were deleted.
    pub(crate) swept: Vec<String>,
}

/// Moves the record files of the store's sessions into the store and sweeps the orphans'.
pub(crate) async fn adopt_files(
    data_dir: &Path,
    store: &Arc<dyn Store>,
    manager: &SessionManager,
) -> anyhow::Result<FilesAdopted> {
    let files = FileRecords::new(data_dir);
    let entries = files.entries().await;
    if entries.is_empty() {
        return Ok(FilesAdopted::default());
    }
    let ours: HashSet<String> = store
        .active_sessions()
        .await?
        .into_iter()
        .filter_map(|row| row.runtime_id)
        .collect();
    let mut done = FilesAdopted::default();
    for (id, kind) in entries.into_iter().filter(|(id, _)| ours.contains(id)) {
        if move_one(&files, store.as_ref(), &id, &kind).await? {
            done.moved.push((id, kind));
        }
    }
    done.swept = manager.forget_orphans_in(&files).await?;
    Ok(done)
}

/// Moves one record into the store unless the store holds it already; deletes the file
/// once the store has it. False when the file could not be read (it stays, for a look).
async fn move_one(
    files: &FileRecords,
    store: &dyn Store,
    id: &str,
    kind: &str,
) -> anyhow::Result<bool> {
    if store.record(id, kind).await?.is_none() {
        let Some(bytes) = files.load(id, kind).await else {
            tracing::warn!(session = %id, kind, "a tool record file could not be read; left in place");
            return Ok(false);
        };
        store.put_record(id, kind, bytes).await?;
    }
    files.clear(id, kind).await;
    Ok(true)
}

/// The start's step, logged: a failure leaves the files for the next start.
pub(crate) async fn adopt_files_logged(
    data_dir: &Path,
    store: &Arc<dyn Store>,
    manager: &SessionManager,
) {
    match adopt_files(data_dir, store, manager).await {
        Ok(done) if done.moved.is_empty() && done.swept.is_empty() => {}
        Ok(done) => tracing::info!(
            moved = ?done.moved,
            swept = ?done.swept,
            "tool record files of the data directory: moved into the store, or swept"
        ),
        Err(e) => tracing::warn!(
            error = format!("{e:#}"),
            "could not move the data directory's tool record files into the store; the next start tries again"
        ),
    }
}
