-- Single sign-on users are keyed on the identity their provider vouches for, (connector,
-- issuer, subject), not on the name a claim gives them: a second connector, or a changed
-- email at the provider, presenting an existing user's name is refused instead of becoming
-- that user (and reaching their recordings). Local users leave these NULL; NULLs are distinct
-- in a unique index on both databases, so the index constrains SSO users only. SSO users made
-- before this migration have no identity yet and are linked at their next login.
ALTER TABLE users ADD COLUMN sso_connector TEXT;
ALTER TABLE users ADD COLUMN sso_issuer TEXT;
ALTER TABLE users ADD COLUMN sso_subject TEXT;
CREATE UNIQUE INDEX users_sso_identity ON users (sso_connector, sso_issuer, sso_subject);
