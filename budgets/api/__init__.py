"""Budget endpoints: `PUT/GET` the budget of an org, a project, or a member in a project."""
