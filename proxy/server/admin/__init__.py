"""The admin API (`/admin/*`) and the dashboard (`/dashboard`), on when
`auth.admin_key_env` names the environment variable holding the admin key."""
