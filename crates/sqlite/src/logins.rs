//! The `web_logins` table (schema_v3.sql): the web UI's sign-ins, each bound to the key it
//! was made with, so a rotated or removed key ends it; and `sso_states` (schema_v16.sql),
//! single sign-on attempts, each taken once.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use crate::{SqliteStore, sql, users};
use sandboxd_core::store::{Login, Logins, NewLogin, SsoState, StoreError};

#[async_trait]
impl Logins for SqliteStore {
    async fn add_login(&self, login: NewLogin) -> Result<(), StoreError> {
        self.write(move |tx| {
            // Expired sign-ins go whenever a new one is made: the table stays small
            // without a reaper of its own.
            tx.execute(
                "DELETE FROM web_logins WHERE expires_at <= ?1",
                [login.created_at],
            )
            .map_err(sql)?;
            let n = tx
                .execute(
                    "INSERT INTO web_logins (token_hash, user_id, key_hash, csrf, created_at, expires_at)
                     SELECT ?1, id, key_hash, ?3, ?4, ?5 FROM users WHERE id = ?2",
                    params![
                        login.token_hash.to_vec(),
                        login.user_id,
                        login.csrf,
                        login.created_at,
                        login.expires_at
                    ],
                )
                .map_err(sql)?;
            if n == 0 {
                return Err(StoreError::Sql(format!(
                    "user {} vanished while signing in",
                    login.user_id
                )));
            }
            Ok(())
        })
        .await
    }

    async fn login(&self, token_hash: [u8; 32], now: i64) -> Result<Option<Login>, StoreError> {
        self.read(move |c| {
            let row: Option<(String, Vec<u8>, String, i64)> = c
                .query_row(
                    "SELECT user_id, key_hash, csrf, expires_at FROM web_logins
                     WHERE token_hash = ?1 AND expires_at > ?2",
                    params![token_hash.to_vec(), now],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()
                .map_err(sql)?;
            let Some((user_id, key_hash, csrf, expires_at)) = row else {
                return Ok(None);
            };
            // The user as of now, and only while they hold the key the sign-in was made with.
            let user = users::one(
                c,
                "WHERE id = ?1 AND key_hash = ?2",
                params![user_id, key_hash],
            )?;
            Ok(user.map(|user| Login {
                user,
                csrf,
                expires_at,
            }))
        })
        .await
    }

    async fn remove_login(&self, token_hash: [u8; 32]) -> Result<(), StoreError> {
        self.write(move |tx| {
            tx.execute(
                "DELETE FROM web_logins WHERE token_hash = ?1",
                [token_hash.to_vec()],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn add_sso_state(&self, state: SsoState) -> Result<(), StoreError> {
        self.write(move |tx| {
            tx.execute(
                "DELETE FROM sso_states WHERE expires_at <= ?1",
                [state.created_at],
            )
            .map_err(sql)?;
            tx.execute(
                "INSERT INTO sso_states (state_hash, pkce_verifier, nonce, created_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    state.state_hash.to_vec(),
                    state.pkce_verifier,
                    state.nonce,
                    state.created_at,
                    state.expires_at
                ],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn take_sso_state(
        &self,
        state_hash: [u8; 32],
        now: i64,
    ) -> Result<Option<SsoState>, StoreError> {
        self.write(move |tx| {
            let row = tx
                .query_row(
                    "DELETE FROM sso_states WHERE state_hash = ?1
                     RETURNING pkce_verifier, nonce, created_at, expires_at",
                    [state_hash.to_vec()],
                    |r| {
                        Ok(SsoState {
                            state_hash,
                            pkce_verifier: r.get(0)?,
                            nonce: r.get(1)?,
                            created_at: r.get(2)?,
                            expires_at: r.get(3)?,
                        })
                    },
                )
                .optional()
                .map_err(sql)?;
            Ok(row.filter(|s| s.expires_at > now))
        })
        .await
    }
}
