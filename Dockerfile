FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY proxy ./proxy
COPY inspector_ui ./inspector_ui
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[postgres]'

# Inside a container the inspector must listen beyond loopback, so it needs a token:
# set TOOLTAP_UI_TOKEN (docker-compose.yml does).
ENV TOOLTAP_DB=sqlite:////data/tooltap.db
VOLUME /data
EXPOSE 8000
CMD ["tooltap", "serve", "--host", "0.0.0.0", "--port", "8000"]
