// Log Analytics workspace and workspace-based Application Insights with local (instrumentation
// key) auth disabled: telemetry is accepted only with an Entra token (Monitoring Metrics
// Publisher), which the Function App gets through APPLICATIONINSIGHTS_AUTHENTICATION_STRING.

@description('Azure region.')
param location string

@description('Name of the Log Analytics workspace.')
param workspaceName string

@description('Name of the Application Insights component.')
param appInsightsName string

@description('Days Log Analytics keeps data.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

@description('Tags for every resource.')
param tags object = {}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
  }
}

@description('Name of the Application Insights component.')
output appInsightsName string = appInsights.name

@description('Resource id of the Application Insights component.')
output appInsightsId string = appInsights.id

@description('Connection string of Application Insights (an endpoint and an id, not a credential once local auth is off).')
output connectionString string = appInsights.properties.ConnectionString
