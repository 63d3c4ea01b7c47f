//! Role storage. Roles are stored as JSON of the validated resource; the evaluator lives in
//! `sallyport_core::role`.

use sallyport_core::audit::{Event, EventType};
use sallyport_core::identity::Traits;
use sallyport_core::role::{Role, RoleSet, presets};
use sqlx::Row;

use crate::{AuthError, AuthServer, Backend};

/// Creates the preset roles once, at the cluster's first start; an admin may change or delete
/// them afterwards and a restart does not bring them back.
pub(crate) async fn create_presets(backend: &Backend) -> Result<(), AuthError> {
    if backend.get_state("presets_created").await?.is_some() {
        return Ok(());
    }
    let now = sallyport_core::unix_now();
    for role in presets() {
        sqlx::query("INSERT INTO roles (name, spec, created, updated) VALUES ($1, $2, $3, $3) ON CONFLICT (name) DO NOTHING")
            .bind(&role.metadata.name)
            .bind(serde_json::to_string(&role)?)
            .bind(now)
            .execute(&backend.pool)
            .await?;
    }
    backend.init_state("presets_created", "1").await?;
    Ok(())
}

fn parse(name: &str, spec: &str) -> Result<Role, AuthError> {
    serde_json::from_str(spec)
        .map_err(|e| AuthError::Storage(format!("stored role {name} is unreadable: {e}")))
}

impl AuthServer {
    pub async fn list_roles(&self) -> Result<Vec<Role>, AuthError> {
        let rows = sqlx::query("SELECT name, spec FROM roles ORDER BY name")
            .fetch_all(&self.backend.pool)
            .await?;
        rows.iter()
            .map(|r| parse(&r.try_get::<String, _>(0)?, &r.try_get::<String, _>(1)?))
            .collect()
    }

    pub async fn get_role(&self, name: &str) -> Result<Option<Role>, AuthError> {
        let row = sqlx::query("SELECT spec FROM roles WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.backend.pool)
            .await?;
        row.map(|r| parse(name, &r.try_get::<String, _>(0)?))
            .transpose()
    }

    /// The roles named, in order; a name with no role is an error naming it.
    pub async fn roles_named(&self, names: &[String]) -> Result<Vec<Role>, AuthError> {
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            match self.get_role(n).await? {
                Some(r) => out.push(r),
                None => return Err(AuthError::NotFound(format!("role {n} does not exist"))),
            }
        }
        Ok(out)
    }

    /// The role set of an identity; roles that were deleted since are skipped.
    pub async fn role_set(&self, names: &[String], traits: &Traits) -> Result<RoleSet, AuthError> {
        let mut roles = Vec::with_capacity(names.len());
        for n in names {
            if let Some(r) = self.get_role(n).await? {
                roles.push(r);
            }
        }
        Ok(RoleSet::new(&roles, traits))
    }

    pub async fn role_count(&self) -> Result<u64, AuthError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM roles")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as u64)
    }

    /// Creates a role, or replaces it when `overwrite` is set.
    pub async fn put_role(
        &self,
        role: &Role,
        overwrite: bool,
        by: &str,
    ) -> Result<bool, AuthError> {
        role.validate()
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let name = role.name();
        let spec = serde_json::to_string(role)?;
        let now = sallyport_core::unix_now();
        let created = sqlx::query("INSERT INTO roles (name, spec, created, updated) VALUES ($1, $2, $3, $3) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(&spec)
            .bind(now)
            .execute(&self.backend.pool)
            .await?
            .rows_affected()
            == 1;
        if !created {
            if !overwrite {
                return Err(AuthError::Conflict(format!(
                    "role {name} already exists; use `sallyctl create -f` to overwrite it"
                )));
            }
            sqlx::query("UPDATE roles SET spec = $1, updated = $2 WHERE name = $3")
                .bind(&spec)
                .bind(now)
                .bind(name)
                .execute(&self.backend.pool)
                .await?;
        }
        let event = if created {
            EventType::RoleCreate
        } else {
            EventType::RoleUpdate
        };
        self.emit(Event::new(event, Some(by)).with("name", name))
            .await?;
        Ok(created)
    }

    /// Saves `role` over the revision `expected` (`Role::revision` of what the caller read),
    /// compare-and-swap on the stored text: a role changed or removed since is a conflict,
    /// never overwritten.
    pub async fn replace_role(
        &self,
        role: &Role,
        expected: &str,
        by: &str,
    ) -> Result<(), AuthError> {
        role.validate()
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        let name = role.name();
        let changed = || {
            AuthError::Conflict(format!(
                "role {name} was changed or removed since you opened it; reload it and make your edits again"
            ))
        };
        let row = sqlx::query("SELECT spec FROM roles WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(changed)?;
        let stored: String = row.try_get(0)?;
        if parse(name, &stored)?.revision() != expected {
            return Err(changed());
        }
        let spec = serde_json::to_string(role)?;
        let swapped =
            sqlx::query("UPDATE roles SET spec = $1, updated = $2 WHERE name = $3 AND spec = $4")
                .bind(&spec)
                .bind(sallyport_core::unix_now())
                .bind(name)
                .bind(&stored)
                .execute(&self.backend.pool)
                .await?
                .rows_affected()
                == 1;
        if !swapped {
            return Err(changed());
        }
        self.emit(Event::new(EventType::RoleUpdate, Some(by)).with("name", name))
            .await?;
        Ok(())
    }

    /// Deletes a role no user holds.
    pub async fn delete_role(&self, name: &str, by: &str) -> Result<(), AuthError> {
        let holders: Vec<String> = self
            .list_users()
            .await?
            .into_iter()
            .filter(|u| u.roles.iter().any(|r| r == name))
            .map(|u| u.name)
            .collect();
        if !holders.is_empty() {
            return Err(AuthError::Conflict(format!(
                "role {name} is held by {} {}; take it away first (`sallyctl users update NAME --set-roles ...`)",
                if holders.len() == 1 { "user" } else { "users" },
                holders.join(", ")
            )));
        }
        let r = sqlx::query("DELETE FROM roles WHERE name = $1")
            .bind(name)
            .execute(&self.backend.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!("role {name} does not exist")));
        }
        self.emit(Event::new(EventType::RoleDelete, Some(by)).with("name", name))
            .await
    }
}
